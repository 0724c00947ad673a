"""The seed's "Current production capability matrix", llama.cpp columns, cell by cell.

Two columns: "Functionally validated llama.cpp process" and "llama.cpp before/after a failed
state probe". Each is observed on real ``werk serve --model demo`` processes over HTTP
(``GET /werk/v1/capabilities?model=demo``), in every situation the second column covers:

* ``validated``: after an opted-in Prefill ran the functional probe and it passed;
* ``before-probe-idle``: no llama-server started yet (a compatible runtime *can* be started);
* ``before-probe-live``: a live llama-server (started by a ``/v1`` request), probe not run;
* ``after-failed-probe``: a live stand-in llama-server that advertises ``--slot-save-path`` but
  drops it (the real binary without that option), after its probe failed;
* ``no-runtime``: no usable llama-server executable, so residency is ``unavailable``.

Cells that the seed gives as "supported or unavailable" (host telemetry) accept exactly those
two values; every other cell is one status.

Two cells go beyond the seed, as issues 16 and 17 decided: ``runtime.memory.reservations`` is
``supported`` because the llama.cpp adapter supplies a requirement for the demo model on this
CPU-only build and ``werk serve`` reserves it (the seed: ``unavailable``, no adapter did; it is
``unavailable`` again where no executable is found, because then no bound is given);
``runtime.state.restore.cross_restart`` stays ``unavailable`` in every scenario here (one
server generation per home: there is no earlier generation to prove against;
``test_llamacpp_cross_restart.py`` covers the restart).
"""

from __future__ import annotations

import stat
from collections.abc import Iterator

import httpx
import pytest
import test_llamacpp_states_e2e as e2e
from test_llamacpp_states_support import LLAMA_SERVER, needs_llama_server

from werk.testing.server import werk_serve

pytestmark = [pytest.mark.slow, needs_llama_server]

SUP, UNAV, EXP, UNSUP = "supported", "unavailable", "experimental", "unsupported"
EITHER = frozenset({SUP, UNAV})

TELEMETRY = ("runtime.memory.telemetry.host", "runtime.memory.telemetry.accelerator")
PROBED = (
    "runtime.state.prefix_cache",
    "runtime.state.persistence",
    "runtime.state.restore",
    "runtime.state.tier.disk",
    "runtime.pd.prefill",
    "runtime.pd.decode",
    "runtime.pd.handoff",
    "runtime.state.restore.prefix",  # the probe's prefix step, beyond the seed's matrix
)
FIXED = {
    "runtime.memory.reservations": SUP,
    "runtime.state.restore.cross_restart": UNAV,
    "runtime.state.tier.ram": UNSUP,
    "runtime.state.tier.vram": UNSUP,
    "runtime.experts.residency": UNSUP,
}


def _column(*, probed: str, residency: str) -> dict[str, frozenset[str]]:
    column = {cap: EITHER for cap in TELEMETRY}
    column |= {cap: frozenset({status}) for cap, status in FIXED.items()}
    column |= {cap: frozenset({probed}) for cap in PROBED}
    column["runtime.model_residency"] = frozenset({residency})
    return column


VALIDATED = _column(probed=EXP, residency=SUP)
"""Column "Functionally validated llama.cpp process"."""
BEFORE_AFTER_FAILED = _column(probed=UNAV, residency=SUP)
"""Column "before/after a failed state probe" with a compatible managed runtime available."""
NO_RUNTIME = _column(probed=UNAV, residency=UNAV) | {
    "runtime.memory.reservations": frozenset({UNAV})
}
"""The same column where no compatible managed runtime is available (nor a requirement: the
demo model would not be reserved, so the reservations row is not claimed either)."""

SCENARIOS = {
    "validated": VALIDATED,
    "before-probe-idle": BEFORE_AFTER_FAILED,
    "before-probe-live": BEFORE_AFTER_FAILED,
    "after-failed-probe": BEFORE_AFTER_FAILED,
    "no-runtime": NO_RUNTIME,
}


def _statuses(client: httpx.Client) -> dict[str, str]:
    body = client.get("/werk/v1/capabilities", params={"model": "demo"}).json()
    rows = [r for r in body["capabilities"] if r.get("model") in (None, "demo")]
    statuses = {r["id"]: r["status"] for r in rows}
    assert len(statuses) == len(rows), "a capability id was reported twice"
    return statuses


def _chat(client: httpx.Client) -> None:
    answer = client.post(
        "/v1/chat/completions",
        json={"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, str]]]:
    """The statuses of every scenario, observed once per module."""
    seen: dict[str, dict[str, str]] = {}
    real = {"WERK_LLAMA_SERVER": str(LLAMA_SERVER)}

    home = tmp_path_factory.mktemp("matrix-real") / "home"
    home.mkdir()
    e2e._create_demo(home, real)
    with (
        werk_serve(home, None, ["--model", "demo"], env=real, startup_timeout=60) as server,
        server.client() as client,
    ):
        seen["before-probe-idle"] = _statuses(client)
        _chat(client)
        seen["before-probe-live"] = _statuses(client)
        prefill = e2e._prefill(client, policy={"retention": "ephemeral"})
        assert prefill.status_code == 200, prefill.text
        seen["validated"] = _statuses(client)

    work = tmp_path_factory.mktemp("matrix-stand-in")
    stand_in = work / "llama-server"
    stand_in.write_text(e2e.STAND_IN.format(real=LLAMA_SERVER))
    stand_in.chmod(stat.S_IRWXU)
    env = {"WERK_LLAMA_SERVER": str(stand_in)}
    home = work / "home"
    home.mkdir()
    e2e._create_demo(home, env)
    with (
        werk_serve(home, None, ["--model", "demo"], env=env, startup_timeout=60) as server,
        server.client() as client,
    ):
        refused = e2e._prefill(client, policy={"retention": "ephemeral"})
        assert refused.status_code == 503, refused.text
        seen["after-failed-probe"] = _statuses(client)

    home = tmp_path_factory.mktemp("matrix-none") / "home"
    home.mkdir()
    e2e._create_demo(home, real)
    missing = {"WERK_LLAMA_SERVER": str(work / "no-such-llama-server")}
    with (
        werk_serve(home, None, ["--model", "demo"], env=missing, startup_timeout=60) as server,
        server.client() as client,
    ):
        seen["no-runtime"] = _statuses(client)
    yield seen


CELLS = [
    pytest.param(scenario, capability, allowed, id=f"{scenario}:{capability}")
    for scenario, column in SCENARIOS.items()
    for capability, allowed in column.items()
]


@pytest.mark.parametrize(("scenario", "capability", "allowed"), CELLS)
def test_cell(
    observed: dict[str, dict[str, str]], scenario: str, capability: str, allowed: frozenset[str]
) -> None:
    status = observed[scenario].get(capability)
    assert status in allowed, f"{scenario}: {capability} is {status}, the seed says {allowed}"


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_no_row_beyond_the_matrix(observed: dict[str, dict[str, str]], scenario: str) -> None:
    assert set(observed[scenario]) == set(SCENARIOS[scenario])
