"""The JSON body of a request, for the wings that speak JSON (native and OpenAI).

Both answer a body that is not JSON with the same 400 in the service's envelope, naming
it ``body`` as their other messages do.
"""

from __future__ import annotations

from typing import Any

from posttrain.http_core import HttpError, Request
from posttrain.service.engine.errors import BadRequest


def body_of(request: Request) -> Any:
    """The JSON body (an empty body is ``{}``), or ``BadRequest``."""
    try:
        return request.json(empty={})
    except HttpError as error:
        raise BadRequest(error.message.replace("request body", "body")) from None
