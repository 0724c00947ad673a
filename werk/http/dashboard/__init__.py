"""The live dashboard ``werk serve`` serves at ``/``: see :mod:`werk.http.dashboard.routes`."""

from .routes import dashboard_routes
from .streams import EventStreams

__all__ = ["EventStreams", "dashboard_routes"]
