"""Werk backend plugin: Diffusers/Transformers media workers."""

__version__ = "0.1.0"
