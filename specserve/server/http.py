"""uvicorn set up for this server: its HTTP layer answers malformed requests (bad request lines,
headers h11 refuses) with OpenAI's JSON error object too, where uvicorn's own answer is plain text."""
from __future__ import annotations

import json
import socket

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .protocol import error_body


class OpenAIErrorsH11Protocol(H11Protocol):
    def send_400_response(self, msg: str) -> None:
        body = json.dumps(error_body(f"malformed HTTP request: {msg}", "invalid_request_error", 400)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for data in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                     h11.EndOfMessage()):
            self.transport.write(self.conn.send(data))
        self.transport.close()


def uvicorn_config(app, host: str, port: int, **kw) -> uvicorn.Config:
    """h11 always (httptools, which uvicorn would prefer where installed, has its own plain-text 400)."""
    return uvicorn.Config(app, host=host, port=port, http=OpenAIErrorsH11Protocol, **kw)


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the model loads: a port in use (or a host this machine does not
    have) fails in one line then, not after a minute of loading; port 0 takes a free one."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart right after a stop binds
        sock.bind((host, port))
    except OSError as e:
        raise ValueError(f"cannot listen on {url(host, port)}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def url(host: str, port: int) -> str:
    """http://host:port, an IPv6 address in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
