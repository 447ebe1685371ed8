"""The OpenAI wing's routes: ``GET /v1/models``, ``GET /v1/models/<name>`` and
``POST /v1/chat/completions`` (``posttrain.service.protocols.openai.chat``), with the
engine's errors in the service's envelope."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posttrain.http_core import HttpError, Request, Response, json_response
from posttrain.service.engine.engine import Engine
from posttrain.service.engine.errors import NotFound, ServiceError
from posttrain.service.protocols.json_bodies import body_of
from posttrain.service.protocols.openai.chat import ChatModels, complete


def openai_routes(engine: Engine) -> list[tuple[str, str, Callable[[Request], Response]]]:
    """``/v1/models`` and ``/v1/chat/completions`` (``posttrain.service.protocols.openai.chat``)."""
    models = ChatModels(engine)

    def answer(call: Callable[[Request], Any]) -> Callable[[Request], Response]:
        def handle(request: Request) -> Response:
            try:
                return json_response(call(request))
            except ServiceError as error:
                raise HttpError(error.status, error.message) from None
        return handle

    def one_model(request: Request) -> Any:
        name = request.match["model"]
        for entry in models.list():
            if entry["id"] == name:
                return entry
        raise NotFound(f"no model {name!r} here; GET /v1/models lists them")

    return [
        ("GET", "/v1/models", answer(lambda r: {"object": "list", "data": models.list()})),
        ("GET", "/v1/models/{model:path}", answer(one_model)),
        ("POST", "/v1/chat/completions", answer(lambda r: complete(engine, models, body_of(r)))),
    ]
