"""What the tinker tests share: the SDK's environment (a `tml-` key, no telemetry) and one
raw JSON request to the tinker routes of a server. Import `sdk_environment` into a test
module to use it there (an autouse fixture applies to the module that imports it)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

API_KEY = "tml-local"


@pytest.fixture(scope="module", autouse=True)
def sdk_environment():
    """A `tml-` key (the SDK refuses to start without one) and no telemetry."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINKER_API_KEY", API_KEY)
        patch.setenv("TINKER_TELEMETRY", "0")
        yield


def post_tinker(url: str, path: str, body: dict) -> tuple[int, dict]:
    """(status, parsed body) of one raw JSON POST to ``url``'s ``/api/v1`` + ``path``."""
    request = urllib.request.Request(
        url + "/api/v1" + path, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "X-API-Key": API_KEY})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")
