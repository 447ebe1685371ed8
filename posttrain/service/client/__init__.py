"""The client wing: the caller's side of the service, standard library only.

``service_client`` talks to a server (``ServiceClient``, ``Session``, ``Run``,
``Operation``); ``rl`` holds the RL helpers and the ordered loop; ``algorithms`` the RL
algorithms as ``build_loss`` variants. It shares the request schema with the server
(``posttrain.service.schema``) and never imports the server's side, so it runs where
torch is not installed. The names below are imported on first use.
"""

from __future__ import annotations

from posttrain.lazy_exports import lazy_face

_EXPORTS = {
    "Operation": "posttrain.service.client.service_client",
    "OperationCancelled": "posttrain.service.client.service_client",
    "OperationFailed": "posttrain.service.client.service_client",
    "Run": "posttrain.service.client.service_client",
    "ServiceClient": "posttrain.service.client.service_client",
    "ServiceRequestError": "posttrain.service.client.service_client",
    "ServiceUnavailable": "posttrain.service.client.service_client",
    "Session": "posttrain.service.client.service_client",
    "AdamParams": "posttrain.service.schema",
}

__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
