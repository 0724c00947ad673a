"""Werk backend plugin: oMLX workers on Apple silicon (macOS)."""

__version__ = "0.1.0"
