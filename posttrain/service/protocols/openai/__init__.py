"""OpenAI's chat API on the engine: ``POST /v1/chat/completions`` and ``GET /v1/models``."""
