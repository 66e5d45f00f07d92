"""The one shape every failure takes: OpenAI's error object with its HTTP status (ApiError raised
anywhere in a request; error_response for the ASGI layers that answer before FastAPI), and on ollama's
API (paths under /api/) ollama's {"error": "..."}, the string its clients read."""
from __future__ import annotations

from typing import Optional

from fastapi.responses import JSONResponse

from .protocol import error_body


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: Optional[str] = None,
                 headers: Optional[dict] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.headers = status, message, type_, param, headers


OLLAMA_PREFIX = "/api/"  # ollama's API (routes/ollama.py)


def error_response(status: int, message: str, type_: str = "invalid_request_error", param: Optional[str] = None,
                   headers: Optional[dict] = None, path: str = "") -> JSONResponse:
    """path: the request's; under OLLAMA_PREFIX the answer takes ollama's shape."""
    body = {"error": message} if path.startswith(OLLAMA_PREFIX) else error_body(message, type_, status, param)
    return JSONResponse(body, status_code=status, headers=headers)


ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["integer", "string", "null"]}}}}}


def document_errors(app) -> None:
    """/openapi.json as the server answers: FastAPI documents its 422 validation error, but every
    invalid request gets a 400 in OpenAI's error shape here."""
    make = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = make()
            for ops in schema.get("paths", {}).values():
                for op in ops.values():
                    responses = op.get("responses", {})
                    if responses.pop("422", None) is not None:
                        responses["400"] = {"description": "Bad request (OpenAI's error object)",
                                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            parts = schema.setdefault("components", {}).setdefault("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                parts.pop(unused, None)
            parts["Error"] = ERROR_SCHEMA
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
