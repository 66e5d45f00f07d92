"""The routes that generate nothing: the playground page at / (server/playground.html: a prompt box,
the answer streaming in coloured by token origin, live figures), /health, /metrics (Prometheus) and
/v1/models."""
from __future__ import annotations

import os
import time

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..serving import Serving


def router(s: Serving) -> APIRouter:
    r = APIRouter()
    # read once, when the app is built: a missing page fails at startup, not on a visitor's request
    with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "playground.html"), encoding="utf-8") as f:
        playground = f.read()

    # HEAD too: ollama's CLI checks that a server runs with HEAD / before anything else
    @r.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def page():
        return HTMLResponse(playground)

    @r.get("/health")
    async def health():
        return Response(status_code=200)

    @r.get("/metrics")
    async def prometheus():
        return Response(generate_latest(s.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "specserve",
                "max_model_len": s.models[name].max_model_len}

    @r.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card(name) for name in s.models]}

    @r.get("/v1/models/{model_id:path}")  # :path: names with a slash (org/model), as vLLM serves them
    async def model(model_id: str):
        if model_id not in s.models:
            raise s.unknown_model(model_id)
        return model_card(model_id)

    return r
