"""ServerConfig: the `specserve serve` settings (no FastAPI import, so the CLI parser stays light)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..options import option

API_KEY_ENV = "SPECSERVE_API_KEY"  # the API key from the environment (server/security.py)


@dataclass
class ServerConfig:
    """`specserve serve` flags, one to one."""

    host: str = option("127.0.0.1", "address to listen on (default: loopback only)")
    port: int = option(8000, "TCP port")
    # required as "Authorization: Bearer KEY" on /v1/* and the docs when set
    api_key: Optional[str] = option(
        None, "require 'Authorization: Bearer KEY' on /v1/* and the API docs (shown by ps: prefer --api-key-file or "
              f"${API_KEY_ENV})")
    # unlike the flag, not shown by `ps`
    api_key_file: Optional[str] = option(
        None, f"the API key from this file's first line (the flag wins, then this, then ${API_KEY_ENV})")
    allowed_hosts: Optional[str] = option(
        None, "Host header names to answer, comma-separated, or '*' for any (default: loopback names when bound "
              "to loopback, any otherwise)")
    served_model_name: Optional[str] = option(None, "the model name clients send (default: the model file's name)")
    max_concurrent_requests: int = option(256, "HTTP requests generating at once; more get 429")
    max_n: int = option(16, "most samples per prompt (n)")
    max_prompts: int = option(32, "most prompts in one /v1/completions request")
    max_body_bytes: int = option(4 * 2**20, "largest request body; larger get 413")
    placement: Optional[str] = option(
        None, "serve a placement file's models and replicas as Ray actors behind this endpoint (specserve/cluster; "
              "the model flags are then the file's)")
    ray_address: Optional[str] = option(
        None, "with --placement: an existing Ray cluster's address (default: a local one on loopback)")

    def __post_init__(self):
        for name in ("port", "max_concurrent_requests", "max_n", "max_prompts", "max_body_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "port" else 1):
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.port > 65535:
            raise ValueError(f"port must be 0-65535 (0: any free port), got {self.port}")
