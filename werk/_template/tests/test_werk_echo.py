"""The conformance kit on this plugin's backend (the plugin must be installed, e.g. ``pip
install -e .``): it starts a runtime through ``start``, drives ``/v1`` and the state hooks the
way ``werk serve`` does, and fails with its whole report when a check fails or a claim is not
proven (``strict``: also when the host had to lower a claim)."""

from collections.abc import Callable

from werk.testing import ConformanceReport


def test_echo_passes_the_conformance_kit(
    werk_conformance: Callable[..., ConformanceReport],
) -> None:
    werk_conformance("echo", strict=True)
