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
    from ..server.http import uvicorn_config
    from ..server.security import api_key

    cfg = ServerConfig(**dataclass_values(args, ServerConfig))
    api_key(cfg)  # a bad --api-key-file fails in one line before the model loads
    llm = AsyncLLM(**llm_kwargs)
    try:
        app = build_app(llm, cfg)
        print(f"specserve: serving {llm.model_name} on http://{cfg.host}:{cfg.port}/v1 (metrics on /metrics)",
              file=sys.stderr, flush=True)
        uvicorn.Server(uvicorn_config(app, cfg.host, cfg.port, log_level="warning")).run()
    finally:
        llm.shutdown()
    return 0
