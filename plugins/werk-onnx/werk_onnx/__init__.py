"""Werk backend plugin ``werk-onnx``: ``onnx-genai`` (ONNX Runtime GenAI in a companion worker)
and ``onnx-runner`` (an external runner per request); see :mod:`werk_onnx.plugin`."""
