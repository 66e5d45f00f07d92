"""The server's limits: request bodies over max_body_bytes (413, declared or chunked) and requests in
flight over max_concurrent_requests (429), each counted where it is cheapest to refuse."""
from __future__ import annotations

from fastapi.responses import StreamingResponse

from .errors import ApiError, error_response


class BodyLimit:
    """Pure ASGI middleware: a body over `limit` bytes gets 413 before anything parses it. A declared
    Content-Length is checked at once (the HTTP layer holds the client to it); a chunked body declares
    none, so it is read here, counted as it arrives and passed on whole: refused inside FastAPI's body
    parsing it would come out as a 400 "error parsing the body"."""

    def __init__(self, app, limit: int, on_error):
        self.app, self.limit, self.on_error = app, limit, on_error

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == b"content-length"), None)
        if declared is not None:
            if not declared.isdigit() or int(declared) > self.limit:
                return await self._refuse(scope, receive, send)
            return await self.app(scope, receive, send)
        chunks, seen = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # gone before the body ended: let the app see that
                chunks = None
                first = msg
                break
            seen += len(msg.get("body", b""))
            if seen > self.limit:
                return await self._refuse(scope, receive, send)
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                break
        replayed = False

        async def replay():  # the whole body once, then the client's own events (a disconnect)
            nonlocal replayed
            if not replayed:
                replayed = True
                return first
            return await receive()

        return await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send):
        self.on_error(413)
        return await error_response(413, f"request body over {self.limit} bytes",
                                    path=scope.get("path", ""))(scope, receive, send)


class InFlight:
    """Requests generating at once, counted from admission (before tokenising) until the response has
    been sent or abandoned; past `limit` a request gets 429 at once."""

    def __init__(self, limit: int):
        self.limit, self.count = limit, 0

    def admit(self) -> "Slot":
        if self.count >= self.limit:
            raise ApiError(429, f"{self.count} requests in flight (the limit is {self.limit}); retry later", "rate_limit_error")
        self.count += 1
        return Slot(self)


class Slot:
    """One admitted request's place; release() is idempotent (error paths and the response may both call it)."""

    def __init__(self, owner: InFlight):
        self._owner: InFlight | None = owner

    def release(self) -> None:
        if self._owner is not None:
            self._owner.count -= 1
            self._owner = None


class SlotStreamingResponse(StreamingResponse):
    """A stream that holds its request's slot until it has been sent, cut off, or never started:
    releasing in the body generator's `finally` would miss a stream whose client left before its first
    byte (the generator never runs), which is why streams used to be counted only from that byte."""

    def __init__(self, content, slot: Slot, **kw):
        super().__init__(content, **kw)
        self.slot = slot

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()
