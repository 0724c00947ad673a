"""werk-transformers: loaded through its real entry point; capability truth with no worker;
what a ``/v1`` body may ask (checked before anything reaches the worker).

A Transformers text model has model residency but no state that outlives a generation:
residency is ``unavailable`` while no environment is found, ``supported`` with only ``load``
when one is found but no worker runs (a load starts one), and every state, prefill/decode and
expert row is ``unsupported`` (the seed's "Transformers compatibility" row).
"""

from __future__ import annotations

import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import werk
from werk import CapabilityContext, CapabilityReport, InvalidRequest, OpenAICall, Unsupported

UNAVAILABLE, UNSUPPORTED = "unavailable", "unsupported"
NO_WORKER_COLUMN = {
    "runtime.model_residency": UNAVAILABLE,
    "runtime.state.prefix_cache": UNSUPPORTED,
    "runtime.state.persistence": UNSUPPORTED,
    "runtime.state.restore": UNSUPPORTED,
    "runtime.state.tier.disk": UNSUPPORTED,
    "runtime.state.tier.ram": UNSUPPORTED,
    "runtime.state.tier.vram": UNSUPPORTED,
    "runtime.pd.prefill": UNSUPPORTED,
    "runtime.pd.decode": UNSUPPORTED,
    "runtime.pd.handoff": UNSUPPORTED,
    "runtime.experts.residency": UNSUPPORTED,
}


@pytest.fixture(autouse=True)
def no_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No worker environment, whatever this machine has (a test that wants one says so)."""
    monkeypatch.setenv("WERK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WERK_BACKENDS_DIR", str(tmp_path / "backends"))
    monkeypatch.delenv("WERK_TRANSFORMERS_PYTHON", raising=False)


def _plugin() -> ModuleType:
    (ep,) = [ep for ep in entry_points(group=werk.ENTRY_POINT_GROUP) if ep.name == "transformers"]
    assert ep.dist is not None and ep.dist.name == "werk-transformers"
    module = ep.load()
    assert isinstance(module, ModuleType) and module.__name__ == "werk_transformers.plugin"
    return module


def _pm() -> werk.WerkPluginManager:
    return werk.get_plugin_manager(
        load_entrypoints=False, plugins=[("werk-transformers", _plugin())], environ={}
    )


def _rows() -> list[CapabilityReport]:
    rows = _pm().capabilities(CapabilityContext(backend="transformers"))
    assert all(r.backend == "transformers" and r.reason for r in rows)
    return rows


def test_registers_the_transformers_backend_for_chat_and_completions() -> None:
    pm = _pm()
    assert set(pm.backends) == {"transformers"}
    descriptor = pm.backends["transformers"]
    assert descriptor.routes == ("chat.completions", "completions")
    assert set(descriptor.formats) == {"hf", "transformers"}
    pm.check_pending()


def test_matrix_without_an_environment_names_the_install_command() -> None:
    rows = _rows()
    core = {r.id: r.status.value for r in rows if r.id.startswith("runtime.")}
    assert core == NO_WORKER_COLUMN
    residency = next(r for r in rows if r.id == "runtime.model_residency")
    assert residency.reason == (
        "torch and Transformers are not installed; run `werk backends install transformers` "
        "(or `pip install werk-transformers[torch]`)"
    )


def test_with_an_environment_but_no_worker_a_load_starts_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    monkeypatch.setenv("WERK_TRANSFORMERS_PYTHON", str(python))
    [row] = [r for r in _rows() if r.id == "runtime.model_residency"]
    assert row.status.value == "supported" and row.operations == ["load"]
    assert row.reason.startswith("no transformers worker is running")
    assert "WERK_TRANSFORMERS_PYTHON" in row.reason and "/load" in row.reason


def test_the_torch_extra_is_the_managed_environment() -> None:
    """`pip install werk-transformers[torch]` and `werk backends install transformers` install
    the same."""
    from werk_transformers.environment import environment_spec

    project = Path(__file__).resolve().parents[1] / "pyproject.toml"
    extra = tomllib.loads(project.read_text())["project"]["optional-dependencies"]["torch"]
    assert tuple(extra) == environment_spec().requirements


def _args(route: str = "chat.completions", **body: Any) -> dict[str, Any]:
    from werk_transformers.requests import generation_args

    base: dict[str, Any] = {"model": "m"}
    if route == "chat.completions":
        base["messages"] = [{"role": "user", "content": "hi"}]
    else:
        base["prompt"] = "once"
    return generation_args(OpenAICall(route=route, body=base | body))  # type: ignore[arg-type]


def test_defaults_follow_openai() -> None:
    chat = _args()
    assert chat == {"max_tokens": None, "stop": [], "messages": [{"role": "user", "content": "hi"}]}
    assert _args("completions") == {"max_tokens": 16, "stop": [], "prompt": "once"}


def test_what_a_body_asks_reaches_the_worker() -> None:
    args = _args(
        max_completion_tokens=5, max_tokens=9, temperature=0.5, top_p=0.9, seed=-1, stop="END",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": t} for t in "ab"]},
            {"role": "assistant", "content": None},
        ],
    )  # fmt: skip
    assert args["max_tokens"] == 5  # max_completion_tokens wins, as in OpenAI's API
    assert args["temperature"] == 0.5 and args["top_p"] == 0.9 and args["stop"] == ["END"]
    assert args["seed"] == 2**63 - 1
    assert [m["content"] for m in args["messages"]] == ["be brief", "ab", ""]
    # No-op values of fields this backend does not do are accepted.
    assert _args(tools=[], logprobs=False, response_format={"type": "text"}, n=1)["stop"] == []


@pytest.mark.parametrize(
    ("route", "body", "error", "text"),
    [
        ("chat.completions", {"tool_choice": "auto"}, Unsupported, "tool calling"),
        (
            "chat.completions",
            {"response_format": {"type": "json_object"}},
            Unsupported,
            "structured",
        ),
        ("chat.completions", {"presence_penalty": 0.5}, Unsupported, "penalties"),
        ("chat.completions", {"messages": [{"role": "tool", "content": "x"}]}, Unsupported, "tool"),
        ("chat.completions", {"messages": []}, InvalidRequest, "non-empty list"),
        (
            "chat.completions",
            {"messages": [{"role": "robot", "content": "x"}]},
            InvalidRequest,
            "role",
        ),
        ("chat.completions", {"max_tokens": 0}, InvalidRequest, "'max_tokens' must be a whole"),
        ("chat.completions", {"top_p": 0}, InvalidRequest, "greater than 0"),
        ("chat.completions", {"seed": 1.5}, InvalidRequest, "'seed'"),
        ("chat.completions", {"stop": 3}, InvalidRequest, "'stop'"),
        ("chat.completions", {"prompt": "x"}, InvalidRequest, "unknown field(s)"),
        ("completions", {"echo": True}, Unsupported, "'echo'"),
        ("completions", {"prompt": ["a", "b"]}, InvalidRequest, "one prompt per request"),
        ("completions", {"best_of": 3}, Unsupported, "one choice"),
    ],
)
def test_what_it_cannot_honour_is_refused_typed(
    route: str, body: dict[str, Any], error: type[Exception], text: str
) -> None:
    with pytest.raises(error) as raised:
        _args(route, **body)
    assert text in str(raised.value)


@given(st.dictionaries(st.text(min_size=1, max_size=12), st.none() | st.integers() | st.text()))
def test_any_body_is_answered_or_refused_typed(extra: dict[str, Any]) -> None:
    """Whatever fields a client adds, the check raises a Werk error or returns arguments."""
    try:
        args = _args(**extra)
    except (InvalidRequest, Unsupported):
        return
    assert set(args) <= {"max_tokens", "stop", "temperature", "top_p", "seed", "messages"}
