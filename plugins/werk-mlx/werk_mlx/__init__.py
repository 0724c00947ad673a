"""Werk backend plugin ``werk-mlx``: backend ``mlx`` (see :mod:`werk_mlx.plugin`)."""
