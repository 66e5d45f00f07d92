"""ServerConfig: the `specserve serve` settings (no FastAPI import, so the CLI parser stays light)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

API_KEY_ENV = "SPECSERVE_API_KEY"  # the API key from the environment (server/security.py)


@dataclass
class ServerConfig:
    """`specserve serve` flags, one to one."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: Optional[str] = None  # required as "Authorization: Bearer KEY" on /v1/* and the docs when set
    api_key_file: Optional[str] = None  # the key from a file's first line (unlike the flag, not shown by `ps`)
    allowed_hosts: Optional[str] = None  # Host header names answered, "a,b" or "*"; default: loopback names on loopback
    served_model_name: Optional[str] = None  # default: the model file's name
    max_concurrent_requests: int = 256  # HTTP requests generating at once; past it: 429
    max_n: int = 16  # samples per prompt
    max_prompts: int = 32  # prompts in one /v1/completions request
    max_body_bytes: int = 4 * 2**20

    def __post_init__(self):
        for name in ("port", "max_concurrent_requests", "max_n", "max_prompts", "max_body_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "port" else 1):
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
