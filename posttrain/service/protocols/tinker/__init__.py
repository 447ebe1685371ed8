"""The tinker SDK's wire protocol (SDK 0.38.x) on the engine, under ``/api/v1``.

``routes`` holds the routes, sessions and sampling sessions; ``training`` the training
clients; ``sampling`` the sampling; ``futures`` the futures the SDK polls; ``proto`` the
protobuf payloads; ``requests`` the checks of the JSON bodies.
"""
