"""The HTTP adapter (starlette): authentication, request ids, the one error mapping,
``/werk/v1`` and the OpenAI-compatible ``/v1``."""
