"""Werk backend plugin: local and remote vLLM through its OpenAI-compatible server."""

__version__ = "0.1.0"
