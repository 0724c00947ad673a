"""When the host offers a backend a state that shares only a prefix with the new prompt."""

from __future__ import annotations

import pytest

from werk.control.continuation import prefix_offered, prefix_proven
from werk.protocol import CapabilityId, CapabilityReport, CapabilityStatus

S = CapabilityStatus
PREFIX, RESTORE = CapabilityId.STATE_RESTORE_PREFIX, CapabilityId.STATE_RESTORE


def rows(
    prefix: CapabilityStatus | None, restore: CapabilityStatus | None
) -> list[CapabilityReport]:
    out = []
    for cap, status in ((PREFIX, prefix), (RESTORE, restore)):
        if status is not None:
            reason = None if status is S.SUPPORTED else "because"
            out.append(CapabilityReport(id=cap, status=status, reason=reason))
    return out


@pytest.mark.parametrize(
    ("prefix", "restore", "allow", "offered", "proven"),
    [
        (S.SUPPORTED, S.SUPPORTED, False, True, True),
        (S.EXPERIMENTAL, S.EXPERIMENTAL, True, True, True),
        (S.EXPERIMENTAL, S.EXPERIMENTAL, False, False, False),  # no opt-in
        (S.UNAVAILABLE, S.UNAVAILABLE, True, True, False),  # proven on first use, read again
        (S.UNAVAILABLE, S.UNAVAILABLE, False, False, False),
        (S.UNAVAILABLE, S.EXPERIMENTAL, True, False, False),  # the probe ran; prefix failed
        (S.UNSUPPORTED, S.EXPERIMENTAL, True, False, False),
        (None, S.EXPERIMENTAL, True, False, False),  # a backend that never says so
        (None, S.UNAVAILABLE, True, False, False),
    ],
)
def test_a_prefix_is_offered_only_where_the_backend_claims_or_is_about_to_prove_it(
    prefix: CapabilityStatus | None,
    restore: CapabilityStatus | None,
    allow: bool,
    offered: bool,
    proven: bool,
) -> None:
    table = rows(prefix, restore)
    assert prefix_offered(table, allow) is offered
    assert prefix_proven(table, allow) is proven
