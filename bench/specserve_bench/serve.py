"""`specserve bench serve`: open-loop load against the running server, the shape of vLLM's `bench serve`.

For each mode (regular decoding, speculation forced on, automatic: the cost model decides per step)
a server is started on loopback; for each request rate, requests arrive by a Poisson or Gamma
process for `--duration` seconds (the same seeded arrivals, prompts and lengths for every mode):
half HumanEval prompts on /v1/completions, half chat questions on /v1/chat/completions, output
lengths drawn from a lognormal per kind (code median 13 tokens, chat median 129, capped by
--max-tokens: the medians the Splitwise paper reports for the Azure LLM inference trace, which is
not on this machine), temperature 0, ignore_eos so each request generates exactly its drawn length.
Reports TTFT / TPOT / ITL p50 and p99, throughput and goodput (requests/s meeting both SLOs) per
rate and mode; writes JSON, markdown and a PNG under --out.

Peers (`--peers llama-server`) take the same arrivals in the same run: llama.cpp's own server on the
same GGUF file (`make llamacpp-server` builds it; `$LLAMA_SERVER` names another binary), with
continuous batching over 16 slots sharing one KV pool, and its chat template rendered by its Jinja
engine as specserve renders it. As peers.py (beside this file) runs llama.cpp: with its weight
repacking first (its AVX2 / AVX-512 layouts), and without it where that fails to start (its AMX
repacking segfaults on some VMs).
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import random
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Optional

from . import machine
from .humaneval import humaneval_prompts
from .load import CHAT

MODES = {  # name -> `specserve serve` speculation flags
    "regular": ["--speculative", "none"],
    "forced": ["--no-fallback"],
    "auto": [],
}
PEERS = ("llama-server",)
LLAMA_SERVER_SLOTS, LLAMA_SERVER_CONTEXT = 16, 16384  # slots, and the tokens of the KV pool they share
_BUILT = os.path.join(os.path.dirname(__file__), "..", "..", "build", "llamacpp", "bin", "llama-server")


def _pct(xs: list[float], q: float) -> Optional[float]:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def workload(rate: float, duration: float, arrivals: str, cv: float, max_tokens: int, seed: int) -> list[dict]:
    """Seeded arrivals [{t, kind, prompt, max_tokens}] over `duration` seconds at `rate` requests/s."""
    rng = random.Random(seed)
    code = humaneval_prompts(164)
    t, out = 0.0, []
    while True:
        if arrivals == "poisson":
            gap = rng.expovariate(rate)
        else:  # Gamma with mean 1/rate and coefficient of variation cv
            shape = 1.0 / (cv * cv)
            gap = rng.gammavariate(shape, 1.0 / (rate * shape))
        t += gap
        if t >= duration:
            return out
        kind = "code" if rng.random() < 0.5 else "chat"
        median = 13 if kind == "code" else 129
        n = max(1, min(max_tokens, int(round(rng.lognormvariate(math.log(median), 0.8)))))
        out.append({"t": t, "kind": kind, "prompt": rng.choice(code) if kind == "code" else rng.choice(CHAT), "max_tokens": n})


async def _one(client, model: str, req: dict, t_start: float, res: list) -> None:
    await asyncio.sleep(max(0.0, t_start + req["t"] - time.perf_counter()))
    sent = time.perf_counter()
    stamps: list[tuple[float, int]] = []  # (time, tokens so far) at each chunk
    tokens = 0
    try:
        extra = {"ignore_eos": True}
        if req["kind"] == "code":
            stream = await client.completions.create(model=model, prompt=req["prompt"], max_tokens=req["max_tokens"],
                                                     temperature=0, stream=True, extra_body=extra,
                                                     stream_options={"include_usage": True})
        else:
            stream = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": req["prompt"]}],
                                                          max_tokens=req["max_tokens"], temperature=0, stream=True,
                                                          extra_body=extra, stream_options={"include_usage": True})
        async for c in stream:
            # a chunk that carries text (as vLLM's bench times them): not a role-only first chunk or an
            # empty last one, which some servers send apart
            if c.choices and (c.choices[0].text if req["kind"] == "code" else c.choices[0].delta.content):
                stamps.append((time.perf_counter(), 0))
            if getattr(c, "usage", None) is not None:
                tokens = c.usage.completion_tokens
        done = time.perf_counter()
        res.append({"ok": True, "ttft": stamps[0][0] - sent if stamps else None, "e2e": done - sent, "tokens": tokens,
                    "itl": [b[0] - a[0] for a, b in zip(stamps, stamps[1:])],
                    "tpot": (stamps[-1][0] - stamps[0][0]) / (tokens - 1) if stamps and tokens > 1 else None})
    except Exception as e:  # counted as a failed request
        res.append({"ok": False, "error": type(e).__name__})


def run_rate(url: str, model: str, reqs: list[dict], slo_ttft: float, slo_tpot: float) -> dict:
    import openai

    async def main():
        client = openai.AsyncOpenAI(base_url=url, api_key="bench", max_retries=0, timeout=600)
        res: list = []
        t0 = time.perf_counter()
        await asyncio.gather(*(_one(client, model, r, t0, res) for r in reqs))
        wall = time.perf_counter() - t0
        await client.close()
        return res, wall

    res, wall = asyncio.run(main())
    ok = [r for r in res if r["ok"]]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    tpot = [r["tpot"] for r in ok if r["tpot"] is not None]
    itl = [x for r in ok for x in r["itl"]]
    good = [r for r in ok if r["ttft"] is not None and r["ttft"] <= slo_ttft and (r["tpot"] is None or r["tpot"] <= slo_tpot)]
    return {"requests": len(reqs), "errors": len(res) - len(ok), "wall_s": round(wall, 2),
            "throughput_tok_s": round(sum(r["tokens"] for r in ok) / wall, 1), "request_rate_done": round(len(ok) / wall, 3),
            "goodput_req_s": round(len(good) / wall, 3), "slo_attainment": round(len(good) / len(reqs), 4) if reqs else None,
            "ttft_p50_s": _pct(ttft, 0.5), "ttft_p99_s": _pct(ttft, 0.99), "tpot_p50_s": _pct(tpot, 0.5),
            "tpot_p99_s": _pct(tpot, 0.99), "itl_p50_s": _pct(itl, 0.5), "itl_p99_s": _pct(itl, 0.99)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerExited(RuntimeError):
    """The server's process ended before it answered /health."""


def _wait_up(proc: subprocess.Popen, url: str, what: str, log: Optional[str] = None) -> None:
    """Until `url`/health answers 200 (llama-server answers 503 while it loads), at most 300 s."""
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            tail = open(log, errors="replace").read()[-600:] if log else ""
            raise ServerExited(f"{what} exited with {proc.returncode}{': ' + tail if tail else ''}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{what} did not come up within 300 s")


def _start_server(flags: list[str]) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specserve.cli.main", "serve", "--port", str(port),
                             "--max-concurrent-requests", "1024", *flags], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    _wait_up(proc, url, f"the server (flags {flags})")
    return proc, url + "/v1"


def llama_server_binary() -> Optional[str]:
    """$LLAMA_SERVER, else the one `make llamacpp-server` built, else one on PATH (None: not installed)."""
    for path in (os.environ.get("LLAMA_SERVER"), os.path.normpath(_BUILT), shutil.which("llama-server")):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _start_llama_server(binary: str, gguf: str, log: str, repack: bool) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(os.cpu_count()),
           "-np", str(LLAMA_SERVER_SLOTS), "--kv-unified", "-c", str(LLAMA_SERVER_CONTEXT), "--jinja",
           "--repack" if repack else "--no-repack", "--no-webui"]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    _wait_up(proc, url, "llama-server", log)
    return proc, url + "/v1"


def _start_peer(binary: str, gguf: str, log: str) -> tuple[subprocess.Popen, str, bool]:
    """llama-server with its weight repacking, or without it if it exits on start: (process, url, repack)."""
    try:
        return (*_start_llama_server(binary, gguf, log, repack=True), True)
    except ServerExited as e:
        print(f"llama-server with repacking did not start ({str(e)[:200]}); again without", flush=True)
    return (*_start_llama_server(binary, gguf, log, repack=False), False)


def _version(binary: str) -> str:
    p = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    return " ".join((p.stdout + p.stderr).split())[:200]


def _spec_metrics(url: str) -> dict:
    body = urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=30).read().decode()
    out = {}
    for line in body.splitlines():
        if line.startswith(("specserve:spec_decode_num_draft_tokens", "specserve:spec_decode_num_accepted_tokens",
                            "specserve:spec_decode_fallback_steps", "specserve:engine_steps")) and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name.split(":", 1)[1].removesuffix("_total")] = float(value)
    return out


def _run_rates(name: str, url: str, args, rates: list[float], metrics: bool) -> dict:
    """Every rate's load against one running server (after a short warm-up)."""
    model = json.loads(urllib.request.urlopen(url + "/models", timeout=30).read())["data"][0]["id"]
    run_rate(url, model, workload(1.0, 3.0, args.arrivals, args.cv, 8, 0), args.slo_ttft, args.slo_tpot)  # warm-up
    out = {}
    for rate in rates:
        before = _spec_metrics(url) if metrics else {}
        reqs = workload(rate, args.duration, args.arrivals, args.cv, args.max_tokens, args.seed)
        r = run_rate(url, model, reqs, args.slo_ttft, args.slo_tpot)
        after = _spec_metrics(url) if metrics else {}
        r["spec"] = {k: after[k] - before.get(k, 0.0) for k in after}
        out[str(rate)] = r
        print(f"{name:12s} rate {rate:5.2f}/s: goodput {r['goodput_req_s']:.3f} req/s, TTFT p50 {r['ttft_p50_s']}, "
              f"TPOT p50 {r['tpot_p50_s']}, errors {r['errors']}", flush=True)
    return out


def run_serve_bench(args) -> dict:
    rates = [float(r) for r in args.rates.split(",")]
    modes = [m for m in args.modes.split(",") if m]  # empty: the peers alone
    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r} (known: {', '.join(MODES)})")
    peers = [p for p in (args.peers or "").split(",") if p]
    for p in peers:
        if p not in PEERS:
            raise ValueError(f"unknown peer {p!r} (known: {', '.join(PEERS)})")
    binary = llama_server_binary() if peers else None
    if peers and binary is None:
        raise RuntimeError("llama-server is not installed: `make llamacpp-server` builds it (or set $LLAMA_SERVER)")
    gguf = None
    if peers:
        from specserve.loading import resolve_model_path
        gguf = resolve_model_path(args.model)
        if not gguf.endswith(".gguf"):
            raise ValueError(f"llama-server serves GGUF files; {gguf} is not one")
    base = (["--model", args.model] if args.model else []) + shlex.split(args.serve_args or "")
    spec = ["--speculative", args.speculative] if args.speculative != "none" else []
    results: dict = {}
    for mode in modes:
        flags = base + (MODES[mode] if mode == "regular" else spec + MODES[mode])
        proc, url = _start_server(flags)
        try:
            results[mode] = _run_rates(mode, url, args, rates, metrics=True)
        finally:
            proc.terminate()
            proc.wait(30)
    peer_info = {}
    for peer in peers:  # only llama-server so far
        os.makedirs(args.out, exist_ok=True)
        log = os.path.join(args.out, ".llama-server.log")
        proc, url, repack = _start_peer(binary, gguf, log)  # its log stays where a start fails
        try:
            results[peer] = _run_rates(peer, url, args, rates, metrics=False)
        finally:
            proc.terminate()
            proc.wait(30)
        os.remove(log)
        peer_info[peer] = {"binary": binary, "version": _version(binary), "slots": LLAMA_SERVER_SLOTS,
                           "kv_pool_tokens": LLAMA_SERVER_CONTEXT, "repack": repack}
    out = {"machine": {**machine.cpu(), "cores": os.cpu_count()},
           "settings": {k: getattr(args, k) for k in ("rates", "modes", "peers", "serve_args", "model", "duration", "arrivals",
                                                      "cv", "max_tokens", "slo_ttft", "slo_tpot", "speculative", "seed")},
           "peers": peer_info, "results": results}
    _write(out, args.out)
    return out


def _write(out: dict, folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.join(folder, f"serve-{stamp}")
    with open(path + ".json", "w") as f:
        json.dump(out, f, indent=1)
    s, m = out["settings"], out["machine"]
    lines = [f"# bench serve ({stamp})", "",
             f"CPU: {m['cpu']}, {m['cores']} cores, flags {' '.join(m['flags'])}. {s['arrivals']} arrivals (cv {s['cv']}), "
             f"{s['duration']} s per rate, drafter `{s['speculative']}`, SLO: TTFT <= {s['slo_ttft']} s and TPOT <= "
             f"{s['slo_tpot']} s. Model `{s.get('model') or 'embedded'}`, server flags `{s.get('serve_args') or ''}`. "
             f"`specserve bench serve --rates {s['rates']} --duration {s['duration']} --max-tokens {s['max_tokens']}`", "",
             *[f"Peer {p}: {i['version']}, {i['slots']} slots sharing a KV pool of {i['kv_pool_tokens']} tokens, "
               f"continuous batching, weight repacking {'on' if i.get('repack') else 'off'}."
               for p, i in out.get("peers", {}).items()], "",
             "| mode | rate (req/s) | goodput (req/s) | SLO attained | tokens/s | TTFT p50 / p99 (s) | TPOT p50 / p99 (ms) "
             "| ITL p50 / p99 (ms) | drafted / accepted | plain steps | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda x, k=1.0, d=3: "-" if x is None else f"{x * k:.{d}f}"  # noqa: E731
    for mode, by_rate in out["results"].items():
        for rate, r in by_rate.items():
            sp = r.get("spec", {})
            drafted = (f"{int(sp.get('spec_decode_num_draft_tokens', 0))} / {int(sp.get('spec_decode_num_accepted_tokens', 0))}"
                       if sp else "-")
            lines.append(f"| {mode} | {rate} | {r['goodput_req_s']:.3f} | {fmt(r['slo_attainment'])} | {r['throughput_tok_s']} | "
                         f"{fmt(r['ttft_p50_s'])} / {fmt(r['ttft_p99_s'])} | {fmt(r['tpot_p50_s'], 1e3, 1)} / "
                         f"{fmt(r['tpot_p99_s'], 1e3, 1)} | {fmt(r['itl_p50_s'], 1e3, 1)} / {fmt(r['itl_p99_s'], 1e3, 1)} | "
                         f"{drafted} | {int(sp.get('spec_decode_fallback_steps', 0)) if sp else '-'} | {r['errors']} |")
    with open(path + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"wrote {path}.json and .md (no matplotlib: no plot)")
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for mode, by_rate in out["results"].items():
        rates = [float(r) for r in by_rate]
        axes[0].plot(rates, [by_rate[r]["goodput_req_s"] for r in by_rate], "o-", label=mode)
        axes[1].plot(rates, [(by_rate[r]["tpot_p50_s"] or 0) * 1e3 for r in by_rate], "o-", label=mode)
        axes[2].plot(rates, [by_rate[r]["ttft_p50_s"] or 0 for r in by_rate], "o-", label=mode)
    for ax, title in zip(axes, ("goodput (req/s)", "TPOT p50 (ms)", "TTFT p50 (s)")):
        ax.set_xlabel("request rate (req/s)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"specserve bench serve on {m['cpu']} ({m['cores']} cores)")
    fig.tight_layout()
    fig.savefig(path + ".png", dpi=110)
    print(f"wrote {path}.json, .md and .png")
