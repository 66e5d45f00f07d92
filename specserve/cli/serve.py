"""`specserve serve`: the OpenAI-compatible server (server/app.py). One flag per ServerConfig field."""
from __future__ import annotations

import argparse
import sys

from ..server.config import ServerConfig
from .args import add_dataclass_args, dataclass_values


def add_serve_args(p: argparse.ArgumentParser) -> None:
    add_dataclass_args(p, ServerConfig)


def cmd_serve(args, llm_kwargs: dict) -> int:
    import uvicorn

    from ..engine.async_llm import AsyncLLM
    from ..server.app import build_app
    from ..server.http import listen, url, uvicorn_config
    from ..server.security import api_key

    cfg = ServerConfig(**dataclass_values(args, ServerConfig))
    api_key(cfg)  # a bad --api-key-file fails in one line before the model loads
    sock = listen(cfg.host, cfg.port)  # so does a port in use
    port = sock.getsockname()[1]
    if cfg.placement:
        from ..cluster.placement import ServePlacement
        from ..cluster.router import ReplicaSet
        placement = ServePlacement.load(cfg.placement)  # a bad file fails in one line before Ray starts
        print(f"specserve: starting {len(placement.replicas)} replicas of {', '.join(placement.models)} on Ray...",
              file=sys.stderr, flush=True)
        llm = ReplicaSet(placement, address=cfg.ray_address)
        what = ", ".join(f"{name} ({len(m.replicas)} replicas)" for name, m in llm.models.items())
    else:
        llm = AsyncLLM(**llm_kwargs)
        what = llm.model_name
        if llm.cache_tokens < llm.max_model_len:  # what a request without max_tokens can get
            what += (f" (its KV cache holds {llm.cache_tokens} tokens of the {llm.max_model_len}-token context: "
                     f"--kv-cache-gib for more)")
        from .. import speed_hint, summary_line, system_info
        info = system_info()
        print(f"specserve: {summary_line(info)}", file=sys.stderr, flush=True)  # what a bug report needs first
        if hint := speed_hint(info, llm.config.model.device, llm.engine.weight_kernel):
            print(f"specserve: {hint}", file=sys.stderr, flush=True)
    try:
        app = build_app(llm, cfg)
        print(f"specserve: serving {what} on {url(cfg.host, port)}/v1 (metrics on /metrics)", file=sys.stderr, flush=True)
        uvicorn.Server(uvicorn_config(app, cfg.host, port, log_level="warning")).run(sockets=[sock])
    finally:
        llm.shutdown()
        sock.close()
    return 0
