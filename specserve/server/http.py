"""uvicorn set up for this server: its HTTP layer answers malformed requests (bad request lines,
headers h11 refuses) with OpenAI's JSON error object too, where uvicorn's own answer is plain text."""
from __future__ import annotations

import json

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
