"""The werk distribution's version and the protocol version it speaks."""

__version__ = "0.1.0"
PROTOCOL_VERSION = "1.0"
