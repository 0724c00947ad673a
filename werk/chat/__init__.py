"""Terminal chat: ``werk run`` / ``werk chat``, their conversation archive and both routes.

* :mod:`.archive` — the backend-independent conversation archive (``chat-sessions/``).
* :mod:`.session` — a conversation and one turn of it, over a :class:`~.session.ChatEngine`.
* :mod:`.local` — the in-process route: start the model's runtime, stop and reap it at exit.
* :mod:`.remote` — the ``--server`` route through a running ``werk serve``.
* :mod:`.native` — the seam for backend-native KV snapshot providers.
* :mod:`.stream`, :mod:`.sse`, :mod:`.render`, :mod:`.repl`, :mod:`.signals` — the pieces.

Nothing is imported here so that ``werk`` commands that do not chat pay nothing for it.
"""
