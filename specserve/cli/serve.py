"""`specserve serve`: the OpenAI-compatible server (server/app.py). One flag per ServerConfig field."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from ..server.config import API_KEY_ENV, ServerConfig
from .args import add_dataclass_args

HELP = {
    "host": "address to listen on (default: loopback only)",
    "port": "TCP port",
    "api_key": "require 'Authorization: Bearer KEY' on /v1/* and the API docs (shown by ps: prefer --api-key-file or "
               f"${API_KEY_ENV})",
    "api_key_file": "the API key from this file's first line (the flag wins, then this, then "
                    f"${API_KEY_ENV})",
    "allowed_hosts": "Host header names to answer, comma-separated, or '*' for any (default: loopback names when bound "
                     "to loopback, any otherwise)",
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
    from ..server.http import uvicorn_config
    from ..server.security import api_key

    cfg = ServerConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServerConfig)})
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
