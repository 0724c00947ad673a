"""A third-party backend installs, works and uninstalls cleanly (``tests/example_backend``).

``werk-example-echo`` is built into a wheel and pip-installed into the clean venv that already
holds the ``werk`` and ``werk-llamacpp`` wheels (see :mod:`_venvs`). With that venv's own
``werk`` this proves: the plugin is discovered through its entry point alone; its capability rows
join the matrix while every other row stays exactly as it was; its one operation hook works
through owner-only dispatch and every operation it does not implement is ``unsupported`` with
the right capability; and ``pip uninstall`` removes its plugin row and rows again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _venvs import CleanVenv, build_wheel, shared_clean_venv

pytestmark = pytest.mark.slow

EXAMPLE_DIR = Path(__file__).resolve().parent / "example_backend"
DIST = "werk-example-echo"

OPERATIONS_SCRIPT = r"""
import functools, json
import anyio
import werk
from werk_example_echo import reverse

pm = werk.get_plugin_manager()
model = werk.ModelSpec(id="m", backend="echo", identity="sha256:0")
runtime = werk.Runtime(backend="echo", model=model, generation="g_test")


def call(operation, **kwargs):
    return anyio.run(functools.partial(pm.call_operation, operation, runtime, **kwargs))


def describe(outcome):
    state = outcome.state
    return {
        "type": type(outcome).__name__,
        "is_prefill_outcome": isinstance(outcome, werk.PrefillOutcome),
        "kind": state.kind.value,
        "data": state.data.hex(),
        "generation": state.generation,
        "prompt_tokens": outcome.prompt_tokens,
        "cached_tokens": outcome.cached_tokens,
    }


hi = call(werk.Operation.PREFILL, call=werk.PrefillCall(prompt="hi"))
wide = call(werk.Operation.PREFILL, call=werk.PrefillCall(prompt="naïve ✓"))
out = {
    "prefill_hi": describe(hi),
    "prefill_wide": describe(wide),
    "reverse": reverse(hi.state).data.hex(),
    "refused": {},
}
others = {
    "DECODE": {"call": werk.DecodeCall(state=hi.state)},
    "SNAPSHOT": {"state": hi.state},
    "RESTORE": {"payload": hi.state},
    "MOVE_EXPERTS": {"move": werk.ExpertMove(expert_ids=["e0"], target="ram")},
}
for name, kwargs in others.items():
    try:
        result = call(werk.Operation[name], **kwargs)
    except werk.WerkError as exc:
        out["refused"][name] = {
            "error": type(exc).__name__,
            "code": exc.code.value,
            "capability": exc.capability,
        }
    else:
        out["refused"][name] = {"returned": repr(result)}
print(json.dumps(out))
"""


@dataclass
class Installed:
    """The venv with the example installed, and what ``werk`` reported before installing it."""

    venv: CleanVenv
    plugins_before: list[dict[str, Any]]
    capabilities_before: list[dict[str, Any]]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> CleanVenv:
    return shared_clean_venv(tmp_path_factory)


@pytest.fixture(scope="module")
def example_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(EXAMPLE_DIR, tmp_path_factory.mktemp("example-dist") / "dist")


@pytest.fixture(scope="module")
def installed(venv: CleanVenv, example_wheel: Path) -> Iterator[Installed]:
    """Install the example for this module; uninstall it afterwards whatever happened."""
    plugins_before = venv.werk_json("plugins")["plugins"]
    capabilities_before = venv.werk_json("capabilities")["capabilities"]
    assert DIST not in {row["name"] for row in plugins_before}
    # --no-index: its one dependency (werk) must be satisfied by the wheel already installed.
    venv.pip("install", "--no-index", example_wheel)
    yield Installed(venv, plugins_before, capabilities_before)
    venv.pip("uninstall", "-y", DIST)


def _echo_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [row for row in rows if row["backend"] == "echo"]


def test_example_is_a_loaded_plugin(installed: Installed) -> None:
    rows = installed.venv.werk_json("plugins")["plugins"]
    echo = [row for row in rows if row["name"] == DIST]
    assert echo == [
        {
            "name": DIST,
            "version": "0.1.0",
            "backends": ["echo"],
            "status": "loaded",
            "error": None,
            "hooks": ["werk_capabilities", "werk_prefill", "werk_register_backends"],
        }
    ]
    assert [row for row in rows if row["name"] != DIST] == installed.plugins_before


def test_example_rows_join_the_matrix_and_nothing_else_changes(installed: Installed) -> None:
    rows = installed.venv.werk_json("capabilities")["capabilities"]
    echo = _echo_rows(rows)
    assert [(row["id"], row["status"], row["model"], row["operations"]) for row in echo] == [
        ("runtime.pd.prefill", "experimental", None, ["prefill"]),
        ("echo.reverse", "supported", None, ["reverse"]),
    ]
    assert echo[0]["reason"], "an experimental row must say why"
    assert echo[1]["reason"] is None
    assert [row for row in rows if row["backend"] != "echo"] == installed.capabilities_before


def test_prefill_works_and_everything_else_is_unsupported(installed: Installed) -> None:
    out = installed.venv.python_json(OPERATIONS_SCRIPT)
    assert out["prefill_hi"] == {
        "type": "PrefillOutcome",
        "is_prefill_outcome": True,
        "kind": "bytes",
        "data": b"hi".hex(),
        "generation": "g_test",
        "prompt_tokens": 2,
        "cached_tokens": None,
    }
    wide = "naïve ✓".encode()
    assert len(wide) == 10  # bytes, not the 7 characters: prompt_tokens counts bytes
    assert out["prefill_wide"]["data"] == wide.hex()
    assert out["prefill_wide"]["prompt_tokens"] == len(wide)
    assert out["reverse"] == b"ih".hex()
    expected = {
        "DECODE": "runtime.pd.decode",
        "SNAPSHOT": "runtime.state.persistence",
        "RESTORE": "runtime.state.restore",
        "MOVE_EXPERTS": "runtime.experts.residency",
    }
    assert out["refused"] == {
        name: {"error": "Unsupported", "code": "unsupported", "capability": capability}
        for name, capability in expected.items()
    }


def test_uninstall_removes_plugin_and_rows(installed: Installed) -> None:
    venv = installed.venv
    assert DIST in {row["name"] for row in venv.werk_json("plugins")["plugins"]}
    venv.pip("uninstall", "-y", DIST)
    plugins = venv.werk_json("plugins")["plugins"]
    assert DIST not in {row["name"] for row in plugins}
    assert plugins == installed.plugins_before
    rows = venv.werk_json("capabilities")["capabilities"]
    assert _echo_rows(rows) == []
    assert rows == installed.capabilities_before
    gone = venv.run(venv.python, "-c", "import werk_example_echo", check=False)
    assert gone.returncode != 0 and "ModuleNotFoundError" in gone.stderr
