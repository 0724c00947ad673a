"""The transport-neutral control plane: :class:`~.interface.WerkControl` and its local
implementation (:mod:`.service`), with the helpers it delegates to."""
