"""Werk backend plugin: llama.cpp's llama-server as a managed child process."""

__version__ = "0.1.0"
