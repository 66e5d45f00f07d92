"""`specserve serve`: the OpenAI-compatible server (server/app.py). One flag per ServerConfig field."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from ..server.config import ServerConfig
from .args import add_dataclass_args

HELP = {
    "host": "address to listen on (default: loopback only)",
    "port": "TCP port",
    "api_key": "require 'Authorization: Bearer KEY' on /v1/*",
    "served_model_name": "the model name clients send (default: the model file's name)",
    "max_concurrent_requests": "HTTP requests generating at once; more get 429",
    "max_n": "most samples per prompt (n)",
    "max_prompts": "most prompts in one /v1/completions request",
    "max_body_bytes": "largest request body; larger get 413",
}


def add_serve_args(p: argparse.ArgumentParser) -> None:
    add_dataclass_args(p, ServerConfig, HELP)


def cmd_serve(args, llm_kwargs: dict) -> int:
    import uvicorn

    from ..engine.async_llm import AsyncLLM
    from ..server.app import build_app

    cfg = ServerConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServerConfig)})
    llm = AsyncLLM(**llm_kwargs)
    app = build_app(llm, cfg)
    print(f"specserve: serving {llm.model_name} on http://{cfg.host}:{cfg.port}/v1 (metrics on /metrics)",
          file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning")
    finally:
        llm.shutdown()
    return 0
