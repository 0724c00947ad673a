"""Werk backend plugin ``transformers``: chat and text completions with Hugging Face
Transformers in a companion worker (see :mod:`werk_transformers.plugin`)."""
