"""`specserve bench serve`'s report and its peer's setup (the load itself runs in the bench)."""
import argparse
import os
import stat

import pytest

from specserve_bench import serve


def _rate(goodput, **extra):
    return {"requests": 10, "errors": 0, "wall_s": 60.0, "throughput_tok_s": 12.5, "request_rate_done": 0.16,
            "goodput_req_s": goodput, "slo_attainment": 0.9, "ttft_p50_s": 0.5, "ttft_p99_s": 1.5, "tpot_p50_s": 0.06,
            "tpot_p99_s": 0.09, "itl_p50_s": 0.06, "itl_p99_s": 0.1, **extra}


def test_the_report_gives_a_peer_its_row_without_speculation_counters(tmp_path):
    out = {"machine": {"cpu": "Test CPU", "flags": ["avx2"], "cores": 2},
           "settings": {"rates": "0.1", "modes": "regular", "peers": "llama-server", "serve_args": "--activations int8",
                        "model": "m.gguf", "duration": 60, "arrivals": "poisson", "cv": 1.0, "max_tokens": 128,
                        "slo_ttft": 2.0, "slo_tpot": 0.1, "speculative": "suffix", "seed": 0},
           "peers": {"llama-server": {"binary": "/x/llama-server", "version": "version: 1 (abc)", "slots": 16,
                                      "kv_pool_tokens": 16384, "repack": True}},
           "results": {"regular": {"0.1": _rate(0.15, spec={"spec_decode_num_draft_tokens": 30.0,
                                                           "spec_decode_num_accepted_tokens": 20.0,
                                                           "spec_decode_fallback_steps": 5.0})},
                       "llama-server": {"0.1": _rate(0.12, spec={})}}}
    serve._write(out, str(tmp_path))
    md = open(next(str(p) for p in tmp_path.iterdir() if p.suffix == ".md")).read()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in md.splitlines() if line.startswith("| ") and "0.1" in line}
    assert rows["regular"].endswith("| 30 / 20 | 5 | 0 |")
    assert rows["llama-server"].endswith("| - | - | 0 |")
    assert "0.120" in rows["llama-server"] and "0.150" in rows["regular"]
    assert ("Peer llama-server: version: 1 (abc), 16 slots sharing a KV pool of 16384 tokens, continuous batching, "
            "weight repacking on.") in md
    assert "server flags `--activations int8`" in md


def test_llama_server_is_found_by_its_variable_first(tmp_path, monkeypatch):
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("LLAMA_SERVER", str(fake))
    assert serve.llama_server_binary() == str(fake)


def test_llama_server_starts_without_repacking_only_where_repacking_exits(monkeypatch):
    started = []

    def fake(binary, gguf, log, repack):
        started.append(repack)
        if repack and mode == "exits":
            raise serve.ServerExited("llama-server exited with -11")
        if repack and mode == "hangs":
            raise RuntimeError("llama-server did not come up within 300 s")
        return "proc", "url"

    monkeypatch.setattr(serve, "_start_llama_server", fake)
    mode = "starts"
    assert serve._start_peer("b", "m.gguf", "log") == ("proc", "url", True) and started == [True]
    mode, started[:] = "exits", []
    assert serve._start_peer("b", "m.gguf", "log") == ("proc", "url", False) and started == [True, False]
    mode, started[:] = "hangs", []  # not a crash: no second wait of 300 s
    with pytest.raises(RuntimeError, match="did not come up"):
        serve._start_peer("b", "m.gguf", "log")
    assert started == [True]


def _args(**kw):
    base = dict(rates="0.1", modes="regular", peers="", serve_args="", model=None, duration=1.0, arrivals="poisson",
                cv=1.0, max_tokens=8, slo_ttft=2.0, slo_tpot=0.1, speculative="none", seed=0, out="unused")
    return argparse.Namespace(**{**base, **kw})


def test_unknown_peers_and_modes_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="unknown peer 'vllm'"):
        serve.run_serve_bench(_args(peers="vllm"))
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        serve.run_serve_bench(_args(modes="fast"))


def test_a_missing_llama_server_is_named_with_the_make_target(monkeypatch):
    monkeypatch.setattr(serve, "llama_server_binary", lambda: None)
    with pytest.raises(RuntimeError, match="make llamacpp-server"):
        serve.run_serve_bench(_args(peers="llama-server"))
    assert not os.path.exists("unused")
