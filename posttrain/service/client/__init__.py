"""The client wing: the caller's side of the service, standard library only.

``service_client`` talks to a server (``ServiceClient``, ``Session``, ``Run``,
``Operation``); ``rl`` holds the RL helpers and the ordered loop; ``algorithms`` the RL
algorithms as ``build_loss`` variants. It shares the request schema with the server
(``posttrain.service.schema``) and never imports the server's side, so it runs where
torch is not installed.
"""

from __future__ import annotations

from posttrain.service.client.service_client import (
    Operation,
    OperationCancelled,
    OperationFailed,
    Run,
    ServiceClient,
    ServiceRequestError,
    ServiceUnavailable,
    Session,
)
from posttrain.service.schema import AdamParams

__all__ = [
    "AdamParams", "Operation", "OperationCancelled", "OperationFailed", "Run", "ServiceClient",
    "ServiceRequestError", "ServiceUnavailable", "Session",
]
