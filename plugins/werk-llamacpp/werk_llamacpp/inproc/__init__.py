"""``llamacpp-inproc``: llama.cpp inside the ``werk serve`` process, through llama-cpp-python.

No child process: the model's weights, its llama.cpp context and the chat-session cache live in
the serving process (``engine.py``, ``sessions.py``); every call into the context runs in a
worker thread, one at a time per model (``lane.py``), so the event loop never blocks. Named states
are the context's sequence state as opaque bytes (``states.py``), proven per runtime generation
by the host's functional probe before any state row says ``experimental`` (``runtime.py``). The
compiled library is built from llama-cpp-python's source once and cached (``library.py``).

The price of in-process: a native crash in llama.cpp ends ``werk serve``; the ``llamacpp``
backend (a supervised ``llama-server`` child) isolates that.
"""
