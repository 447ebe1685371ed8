"""Reading JSON bodies, for the wings whose requests are JSON (native, OpenAI, tinker).

``body_of`` answers a body that is not JSON with the service's 400, naming it ``body`` as
the other messages do; ``json_object``, ``only`` and ``required`` check a body's shape;
``adam_params`` reads the ``adam_params`` object that posttrain's ``optim_step`` and the
tinker SDK's both send, into the shared ``AdamParams``.
"""

from __future__ import annotations

from typing import Any

from posttrain.http_core import HttpError, Request
from posttrain.service.engine.checks import check_adam_params, kind
from posttrain.service.engine.errors import BadRequest
from posttrain.service.schema import ADAM_KEYS, AdamParams


def body_of(request: Request) -> dict[str, Any]:
    """The JSON body, an object (an empty body is ``{}``), or ``BadRequest``: every request
    of these wings is an object, and a handler reads its fields before it checks them."""
    try:
        body = request.json(empty={})
    except HttpError as error:
        raise BadRequest(error.message.replace("request body", "body")) from None
    return json_object(body, "body")


def json_object(value: Any, where: str) -> dict[str, Any]:
    """``value`` when it is a JSON object; ``BadRequest`` naming ``where`` otherwise."""
    if not isinstance(value, dict):
        raise BadRequest(f"{where}: expected a JSON object, got {kind(value)}")
    return value


def only(body: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    """``BadRequest`` naming the fields of ``body`` that are not ``allowed`` (never ignored)."""
    extra = sorted(set(body) - set(allowed))
    if extra:
        raise BadRequest(
            f"{where}: unknown field(s) {', '.join(map(repr, extra))}; "
            f"accepted: {', '.join(allowed)}"
        )


def required(body: dict[str, Any], key: str, where: str) -> Any:
    """``body[key]``; ``BadRequest`` when it is missing."""
    if key not in body:
        raise BadRequest(f"{where}: missing field {key!r}")
    return body[key]


def adam_params(value: Any) -> AdamParams:
    """``{learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm}``, every key
    required (no hidden defaults) and each in range (``engine.checks.check_adam_params``)."""
    params = json_object(value, "adam_params")
    only(params, ADAM_KEYS, "adam_params")
    missing = [key for key in ADAM_KEYS if key not in params]
    if missing:
        raise BadRequest(
            f"adam_params: missing {', '.join(missing)}; every AdamW hyper-parameter is explicit "
            f"({', '.join(ADAM_KEYS)})"
        )
    return check_adam_params(AdamParams(**{key: params[key] for key in ADAM_KEYS}))
