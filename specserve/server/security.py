"""Who may talk to the server: the API key (flag, SPECSERVE_API_KEY or --api-key-file, compared in
constant time) and the Host header (DNS rebinding: a page on evil.example whose name is made to
resolve to 127.0.0.1 reaches a loopback server from the browser, but its requests carry
Host: evil.example)."""
from __future__ import annotations

import hmac
import ipaddress
import os
from typing import Mapping, Optional

from .config import API_KEY_ENV, ServerConfig
from .errors import OLLAMA_PREFIX, error_response

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# with a key, the API's description is as private as the API (as vLLM guards them)
DOC_PATHS = ("/docs", "/redoc", "/openapi.json")  # and below them (/docs/oauth2-redirect)
# the API outside /v1/ (vLLM's /tokenize and /detokenize, llama-server's /infill): guarded as /v1/ is
ROOT_API_PATHS = ("/tokenize", "/detokenize", "/infill")


def api_key(cfg: ServerConfig, env: Mapping[str, str] = os.environ) -> Optional[str]:
    """The key clients must send: --api-key, else --api-key-file's first line, else $SPECSERVE_API_KEY
    (the flag shows in `ps`; the file and the variable do not). ValueError (one line) for a file that
    cannot be read or holds no key."""
    if cfg.api_key:
        return cfg.api_key
    if cfg.api_key_file:
        try:
            with open(cfg.api_key_file, encoding="utf-8") as f:
                key = f.readline().strip()
        except OSError as e:
            raise ValueError(f"--api-key-file {cfg.api_key_file}: {e.strerror or e}") from None
        if not key:
            raise ValueError(f"--api-key-file {cfg.api_key_file} holds no key (its first line is empty)")
        return key
    return env.get(API_KEY_ENV) or None


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(cfg: ServerConfig) -> Optional[frozenset[str]]:
    """Host header names (no port) the server answers; None: any. --allowed-hosts "a,b" lists them,
    "*" allows any; by default a server bound to loopback answers only to loopback names."""
    if cfg.allowed_hosts is not None:
        names = frozenset(h.strip().lower() for h in cfg.allowed_hosts.split(",") if h.strip())
        return None if "*" in names else names
    return LOOPBACK_NAMES | {cfg.host.lower()} if is_loopback(cfg.host) else None


def host_name(header: str) -> str:
    """'localhost:8000' -> 'localhost', '[::1]:8000' -> '::1'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """Pure ASGI middleware, before any parsing: a Host not allowed gets 400 on every path (a rebound
    page could read /metrics too); with a key, /v1/* and the API docs need `Authorization: Bearer KEY`
    (401). /health, /metrics and the playground page stay open, as in vLLM."""

    def __init__(self, app, key: Optional[str], hosts: Optional[frozenset[str]], on_error):
        self.app, self.on_error, self.hosts = app, on_error, hosts
        self.expected = None if key is None else f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict((k.lower(), v) for k, v in scope.get("headers", []))
        host = headers.get(b"host")
        # no Host at all is HTTP/1.0 from a script, not a browser (browsers always send one)
        path = scope.get("path", "")
        if self.hosts is not None and host is not None and host_name(host.decode("latin-1")) not in self.hosts:
            self.on_error(400)
            return await error_response(400, "the Host header names a host this server does not answer to "
                                             "(see --allowed-hosts)", param="Host", path=path)(scope, receive, send)
        if self.expected is not None and (path.startswith(("/v1/", OLLAMA_PREFIX) + DOC_PATHS) or path in ROOT_API_PATHS):
            if not hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
                self.on_error(401)
                return await error_response(401, "missing or wrong API key (Authorization: Bearer KEY)",
                                            "authentication_error", path=path)(scope, receive, send)
        return await self.app(scope, receive, send)
