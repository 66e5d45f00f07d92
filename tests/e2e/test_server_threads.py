"""/metrics' specserve:cpu_threads reads the engine's thread count (it once read 0 always: the threads=
argument of AsyncLLM's stats snapshot sat inside a comment): the pinned count with --threads, the
governor's current count without."""
import http.client
import threading

import pytest

from .serving import running

pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")


def cpu_threads(port) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/completions", body='{"prompt": "hi", "max_tokens": 2}',
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    r.read()
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    conn.close()
    return float(next(ln.split()[-1] for ln in body.splitlines() if ln.startswith("specserve:cpu_threads ")))


def serve_and_read(**llm_kwargs) -> tuple:
    from specserve import AsyncLLM
    from specserve.server.app import build_app
    from specserve.server.config import ServerConfig
    llm = AsyncLLM(kv_cache_gib=0.125, max_model_len=256, **llm_kwargs)
    try:
        with running(build_app(llm, ServerConfig())) as port:
            return cpu_threads(port), llm.engine.threads
    finally:
        llm.shutdown()


@pytest.fixture
def torch_threads():
    import torch
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)  # the engine pins torch's (process-wide) threads: give the next tests theirs back


def test_a_pinned_thread_count_is_what_metrics_reads(torch_threads):
    value, governor = serve_and_read(num_threads=1)
    assert governor is None and value == 1


def test_the_governed_thread_count_is_what_metrics_reads(torch_threads):
    import torch
    value, governor = serve_and_read()
    # on one core there is nothing to govern: torch's own count is the engine's
    assert value == (governor.threads if governor is not None else torch.get_num_threads()) and value >= 1


def test_the_engine_is_built_on_the_thread_that_steps_it(monkeypatch):
    """libgomp keeps an OpenMP pool per thread that runs parallel regions; a model loaded on the
    caller's thread left a second pool beside the stepping thread's, and served tokens took 1.6x
    LLM.generate's time (docs/decisions.md#engine-thread). The caller's thread must run none of it."""
    from specserve.engine import async_llm

    built_on = []

    class Recording(async_llm.LLM):
        def __init__(self, *args, **kwargs):
            built_on.append(threading.current_thread())
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(async_llm, "LLM", Recording)
    llm = async_llm.AsyncLLM(kv_cache_gib=0.125, max_model_len=256)
    try:
        assert built_on == [llm._thread] and built_on[0] is not threading.current_thread()
        assert llm.tokenizer.decode(llm.encode("def add(a, b):"))  # and the object is whole
    finally:
        llm.shutdown()


def test_a_model_that_cannot_load_raises_from_the_constructor_and_leaves_no_thread():
    from specserve import AsyncLLM

    before = {t for t in threading.enumerate() if t.name == "specserve-engine"}
    with pytest.raises(FileNotFoundError, match="no-such-model.gguf"):
        AsyncLLM("/nonexistent/no-such-model.gguf")
    assert {t for t in threading.enumerate() if t.name == "specserve-engine"} == before


def test_a_constructor_that_gives_up_after_the_load_ends_the_engine_thread(monkeypatch):
    """Ctrl-C or an error between the load and the loop's start: the thread that holds the model
    must end (not wait forever for a loop that never starts)."""
    from specserve.engine import async_llm

    def broken(**_):
        raise KeyboardInterrupt

    monkeypatch.setattr(async_llm, "EngineStats", broken)
    before = set(threading.enumerate())
    with pytest.raises(KeyboardInterrupt):
        async_llm.AsyncLLM(kv_cache_gib=0.125, max_model_len=256)
    started = [t for t in threading.enumerate() if t.name == "specserve-engine" and t not in before]
    for t in started:
        t.join(30)
    assert not [t for t in started if t.is_alive()]
