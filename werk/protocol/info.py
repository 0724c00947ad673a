"""``GET /werk/v1/info`` shapes (§3)."""

from __future__ import annotations

import enum

from .base import Response
from .policy import PersistenceDefaults

__all__ = ["AuthMode", "InfoResponse", "ModelRef", "PluginInfo", "PluginStatus", "ServerInfo"]


class AuthMode(enum.StrEnum):
    API_KEY = "api_key"
    UNAUTHENTICATED_LOCAL = "unauthenticated_local"


class PluginStatus(enum.StrEnum):
    LOADED = "loaded"
    FAILED = "failed"


class PluginInfo(Response, frozen=True, kw_only=True):
    """One plugin row. ``hooks`` lists the hook names the plugin implements."""

    name: str
    version: str | None
    backends: list[str]
    status: PluginStatus
    error: str | None = None
    hooks: list[str] = []


class ModelRef(Response, frozen=True, kw_only=True):
    id: str
    backend: str


class ServerInfo(Response, frozen=True, kw_only=True):
    started_at: str
    auth: AuthMode


class InfoResponse(Response, frozen=True, kw_only=True):
    protocol: str
    werk_version: str
    server: ServerInfo
    plugins: list[PluginInfo]
    models: list[ModelRef]
    persistence_defaults: PersistenceDefaults | None = None
