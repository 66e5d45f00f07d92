"""Replicas of a placement served behind one OpenAI endpoint on loopback, and a trace of generations
streamed through it: what `bench/placement_replay.py` measures a placement with (Ray actors, one per
replica, pinned to its device's core)."""
from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time

from specserve.planner.llm import Generation, LLMDevice


def serve_in_thread(app):
    """uvicorn on a free loopback port in a daemon thread; returns (server, port)."""
    import uvicorn

    from specserve.server.http import uvicorn_config
    srv = uvicorn.Server(uvicorn_config(app, "127.0.0.1", 0, log_level="warning"))
    threading.Thread(target=srv.run, daemon=True).start()
    deadline = time.time() + 60
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    if not srv.started:
        raise RuntimeError("the server did not start within 60 s")
    return srv, srv.servers[0].sockets[0].getsockname()[1]


async def one(client, g, sem, t0: float, vocab: int) -> dict:
    """Stream one generation; its TTFT from its arrival, TPOT over the tokens after the first, and
    when each token came (seconds from t0)."""
    ids = [int(g.arrival * 1000 + 7919 * i) % (vocab - 200) + 100 for i in range(g.prompt_tokens)]
    async with sem:
        times = []
        tokens = 0
        try:
            stream = await client.completions.create(
                model=g.model, prompt=ids, max_tokens=g.output_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            async for ch in stream:
                if ch.choices and ch.choices[0].text:
                    times.append(time.perf_counter() - t0)
                if ch.usage is not None:
                    tokens = ch.usage.completion_tokens
        except Exception as e:  # counted as not served: the run goes on
            return {"error": f"{type(e).__name__}: {str(e)[:120]}"}
    if not times:
        return {"error": "no token"}
    ttft = times[0] - g.arrival
    tpot = (times[-1] - times[0]) / (tokens - 1) if tokens > 1 else 0.0
    return {"ttft": ttft, "tpot": tpot, "tokens": tokens, "times": times}


async def replay(port: int, gens, drain_s: float, vocab: int = 49152) -> list[dict]:
    """Every generation streamed at its arrival (vocab: the embedded model's); what has not finished
    drain_s after the last arrival did not meet its SLO."""
    from openai import AsyncOpenAI
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0, timeout=600)
    sem = asyncio.Semaphore(256)
    t0 = time.perf_counter()
    tasks = []
    for g in gens:
        delay = t0 + g.arrival - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(client, g, sem, t0, vocab)))
    done, pending = await asyncio.wait(tasks, timeout=drain_s)
    for t in pending:  # bounded: what has not finished by then did not meet its SLO
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    await client.close()
    return [t.result() if t in done else {"error": "not finished"} for t in tasks]


@contextlib.contextmanager
def serving(devices: list[LLMDevice], engine: dict):
    """The placement's replicas (one Ray actor each, pinned to its device's core) behind one endpoint,
    warmed (kernels, the draft's first pass); yields the endpoint's port."""
    from specserve.cluster.placement import ReplicaSpec, ServePlacement
    from specserve.cluster.router import ReplicaSet
    from specserve.server.app import build_app
    replicas = [ReplicaSpec(m, device=d, cores=(d % (os.cpu_count() or 1),),
                            overrides={"speculative": "draft"} if m in dev.drafts else {})
                for d, dev in enumerate(devices) for m in dev.models]
    models = sorted({m for dev in devices for m in dev.models})
    rs = ReplicaSet(ServePlacement({m: dict(engine) for m in models}, replicas), num_cpus=os.cpu_count())
    try:
        srv, port = serve_in_thread(build_app(rs))
        asyncio.run(replay(port, [Generation(0.0, m, 16, 4) for m in models for _ in range(2)], 120))
        yield port, [st.pid for st in rs.states]
        srv.should_exit = True
    finally:
        rs.shutdown()


def cpu_s(pid: int) -> float:
    """CPU seconds process pid has used (every thread, on any core)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
