"""The service's protocol wings: each a thin translation of one wire format onto the engine.

- ``native``: posttrain's own JSON routes under ``/v1/training`` (the primitives);
- ``openai``: OpenAI's ``/v1/chat/completions`` and ``/v1/models``;
- ``tinker``: the tinker SDK's wire protocol under ``/api/v1``.

A wing reads its wire format, builds the engine's typed requests
(``posttrain.service.engine.requests``) and calls the engine's public methods; it never
reaches into another wing (import-linter holds both rules, see ``.importlinter``).
"""
