"""Load test of `specserve serve` on loopback: many streaming clients (the official `openai` client)
for a fixed time, then clients that hang up mid-stream; afterwards no KV block may be in use.

    python -m specserve_bench.load --clients 64 --seconds 600 [--out bench/results/load-DATE.json]

Starts the server itself (127.0.0.1, a free port) unless --url is given. Each client sends streaming
completions and chat requests back to back (HumanEval prompts and chat questions, 16-128 tokens),
until the deadline; every loop is bounded in time and count and stops by itself.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.request

from . import machine

CHAT = ["What is the capital of France?", "Write a haiku about the sea.", "Explain recursion in one sentence.",
        "List three prime numbers.", "How do I reverse a list in Python?", "What is 12 times 7?"]


def _metric(url: str, name: str, key: str = "") -> float:
    body = urllib.request.urlopen(url.rstrip("/").removesuffix("/v1") + "/metrics", timeout=30).read().decode()
    m = re.search(rf"^{re.escape(name)}{re.escape(key)} ([0-9.e+-]+)$", body, re.M)
    return float(m.group(1)) if m else float("nan")


async def _client(cid: int, url: str, key: str, model: str, deadline: float, prompts: list[str], out: dict,
                  max_requests: int) -> None:
    import openai
    client = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=300)
    rng = random.Random(cid)
    for _ in range(max_requests):
        if time.time() >= deadline:
            break
        n_tok = rng.randint(16, 128)
        t0 = time.perf_counter()
        first = None
        tokens = 0
        try:
            if rng.random() < 0.5:
                stream = await client.completions.create(model=model, prompt=rng.choice(prompts), max_tokens=n_tok,
                                                         temperature=rng.choice([0, 0.8]), stream=True)
                async for c in stream:
                    if c.choices and c.choices[0].text:
                        first = first or time.perf_counter()
                        tokens += 1
            else:
                stream = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": rng.choice(CHAT)}],
                                                              max_tokens=n_tok, temperature=rng.choice([0, 0.8]), stream=True)
                async for c in stream:
                    if c.choices and c.choices[0].delta.content:
                        first = first or time.perf_counter()
                        tokens += 1
            out["ok"] += 1
            out["chunks"] += tokens
            if first is not None:
                out["ttft"].append(first - t0)
        except Exception as e:  # counted, never fatal to the run
            out["errors"] += 1
            out["error_kinds"][type(e).__name__] = out["error_kinds"].get(type(e).__name__, 0) + 1
    await client.close()


async def _hang_up(url: str, key: str, model: str, n: int) -> int:
    """n streaming requests that read a few chunks and close the connection; returns how many started."""
    import openai
    started = 0

    async def one(i):
        nonlocal started
        client = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)
        stream = await client.completions.create(model=model, prompt=CHAT[i % len(CHAT)], max_tokens=2000,
                                                 stream=True, extra_body={"ignore_eos": True})
        k = 0
        async for _ in stream:
            k += 1
            if k == 3:
                break
        started += 1
        await stream.close()
        await client.close()

    await asyncio.gather(*(one(i) for i in range(n)))
    return started


def run_load(url: str, key: str, clients: int, seconds: float, hang_ups: int = 16, max_requests: int = 10_000) -> dict:
    from .humaneval import humaneval_prompts
    model = json.loads(urllib.request.urlopen(urllib.request.Request(url + "/models", headers={"Authorization": f"Bearer {key}"}),
                                              timeout=30).read())["data"][0]["id"]
    prompts = humaneval_prompts(40)
    out = {"ok": 0, "errors": 0, "error_kinds": {}, "chunks": 0, "ttft": []}
    t0 = time.time()

    async def main():
        deadline = time.time() + seconds
        await asyncio.gather(*(_client(i, url, key, model, deadline, prompts, out, max_requests) for i in range(clients)))
        return await _hang_up(url, key, model, hang_ups)

    started = asyncio.run(main())
    wall = time.time() - t0
    blocks_after_load = _wait_idle(url)
    ttft = sorted(out["ttft"])
    return {"clients": clients, "seconds": round(wall, 1), "requests_ok": out["ok"], "errors": out["errors"],
            "error_kinds": out["error_kinds"], "streamed_chunks": out["chunks"],
            "chunks_per_s": round(out["chunks"] / max(wall, 1e-9), 1),
            "ttft_p50_s": ttft[len(ttft) // 2] if ttft else None, "ttft_p99_s": ttft[int(len(ttft) * 0.99)] if ttft else None,
            "hang_ups_started": started, "kv_blocks_in_use_after": blocks_after_load}


def _wait_idle(url: str, timeout: float = 60) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if _metric(url, "specserve:num_requests_running") == 0 and _metric(url, "specserve:kv_blocks_in_use") == 0:
            break
        time.sleep(0.2)
    return _metric(url, "specserve:kv_blocks_in_use")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--hang-ups", type=int, default=16)
    ap.add_argument("--url", default=None, help="a running server's /v1 URL (default: start one)")
    ap.add_argument("--api-key", default="load-test")
    ap.add_argument("--speculative", default="none")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    server = None
    url = args.url
    if url is None:
        port = _free_port()
        server = subprocess.Popen([sys.executable, "-m", "specserve.cli.main", "serve", "--port", str(port), "--api-key",
                                   args.api_key, "--max-num-seqs", "64", "--speculative", args.speculative,
                                   "--max-concurrent-requests", str(max(256, args.clients * 2))])
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
    try:
        res = run_load(url, args.api_key, args.clients, args.seconds, args.hang_ups)
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
    res.update(machine.cpu(), speculative=args.speculative)
    print(json.dumps(res, indent=1))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if res["errors"] == 0 and res["kv_blocks_in_use_after"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
