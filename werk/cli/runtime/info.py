"""``werk runtime info`` and ``werk runtime capabilities``: what the running server is."""

from __future__ import annotations

from typing import Annotated

from ...protocol import CapabilitiesResponse, CapabilityStatus, InfoResponse
from ._common import (
    DEFAULT_SERVER,
    DEFAULT_TIMEOUT,
    Connection,
    JsonOpt,
    KeyFileOpt,
    ServerOpt,
    TimeoutOpt,
    model_option,
    respond,
)
from ._render import show, table

__all__ = ["capabilities_command", "info"]

_STATUS_STYLE = {
    CapabilityStatus.SUPPORTED: "green",
    CapabilityStatus.EXPERIMENTAL: "yellow",
    CapabilityStatus.UNAVAILABLE: "red",
    CapabilityStatus.UNSUPPORTED: "dim",
    CapabilityStatus.EXTERNALLY_MANAGED: "cyan",
    CapabilityStatus.METADATA_ONLY: "blue",
}


def info(
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Show the server: protocol and Werk version, authentication mode, loaded plugins,
    configured models and the prefill persistence defaults (GET /werk/v1/info)."""
    respond(
        Connection(server, api_key_file, timeout),
        as_json,
        lambda client: client.info(),
        lambda response: _print_info(server, response),
    )


def _print_info(server: str, response: InfoResponse) -> None:
    auth = response.server.auth.value
    if auth == "unauthenticated_local":
        auth += " (one shared `local` principal: not an isolation boundary)"
    defaults = response.persistence_defaults
    persistence = (
        "none (a prefill without a policy is ephemeral)"
        if defaults is None
        else f"retention {defaults.retention}, reuse {defaults.reuse}, "
        f"ttl {defaults.ttl_seconds or 'none'}, pin {_yes(defaults.pin)}, "
        f"allow_experimental {_yes(defaults.allow_experimental)}"
    )
    show(
        table(
            "Server",
            ("", ""),
            [
                ("url", server),
                ("protocol", response.protocol),
                ("werk", response.werk_version),
                ("started", response.server.started_at),
                ("auth", auth),
                ("persistence defaults", persistence),
            ],
        )
    )
    show("")
    if response.models:
        show(table("Models", ("ID", "BACKEND"), [(m.id, m.backend) for m in response.models]))
    else:
        show("Models: none configured (start the server with --model ID)")
    show("")
    show(
        table(
            "Plugins",
            ("NAME", "VERSION", "STATUS", "BACKENDS", "ERROR"),
            [
                (p.name, p.version, p.status.value, ",".join(p.backends), p.error)
                for p in response.plugins
            ],
        )
    )


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def capabilities_command(
    model: Annotated[str | None, model_option("Only rows for this model.")] = None,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Show the running server's capability matrix (GET /werk/v1/capabilities).

    Each row is one capability of one backend (and model, when known). Statuses are shown
    exactly as reported — supported, unsupported, unavailable, experimental,
    externally_managed, metadata_only — and anything but `supported` carries a reason. An
    `experimental` capability needs `allow_experimental: true` (e.g. prefill
    --allow-experimental). Host-level rows (telemetry) have no model.
    """
    respond(
        Connection(server, api_key_file, timeout),
        as_json,
        lambda client: client.capabilities(model=model),
        _print_capabilities,
    )


def _print_capabilities(response: CapabilitiesResponse) -> None:
    from rich.text import Text

    rows = [
        (
            r.id,
            Text(r.status.value, style=_STATUS_STYLE.get(r.status, "")),
            r.backend,
            r.model,
            r.reason,
        )
        for r in response.capabilities
    ]
    if not rows:
        show("No capabilities reported.")
        return
    show(table("Capabilities", ("ID", "STATUS", "BACKEND", "MODEL", "REASON"), rows))
