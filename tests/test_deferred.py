"""``BackendDescriptor`` with ``"module:function"`` strings: imported on the first call only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import werk
from werk import BackendDescriptor, ModelSpec, Runtime

MODULE = """
CALLS = []

async def start(spec):
    from werk import Runtime
    CALLS.append(spec.id)
    return Runtime(backend=spec.backend, model=spec, generation="g_1")

async def stop(runtime):
    CALLS.append("stop")

NOT_CALLABLE = 3
"""


@pytest.fixture
def lazy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = "werk_lazy_backend_for_test"
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


@pytest.mark.anyio
async def test_a_string_start_and_stop_import_their_module_on_first_use(lazy_module: str) -> None:
    descriptor = BackendDescriptor(
        name="lazy", start=f"{lazy_module}:start", stop=f"{lazy_module}:stop"
    )
    assert lazy_module not in sys.modules  # registering imports nothing
    spec = ModelSpec(id="m", backend="lazy", identity="sha256:" + "0" * 64)
    runtime = await descriptor.start_runtime(spec)
    assert isinstance(runtime, Runtime) and runtime.model.id == "m"
    await descriptor.stop_runtime(runtime)
    assert sys.modules[lazy_module].CALLS == ["m", "stop"]
    assert await descriptor.runtime_requirement(spec) is None  # none given


@pytest.mark.parametrize("reference", ["nocolon", "a:b:c", "mod:", ":f", "a b:c", "1mod:f"])
def test_a_malformed_reference_is_refused_at_registration(reference: str) -> None:
    with pytest.raises(ValueError, match=r"package\.module:function"):
        BackendDescriptor(name="lazy", start=reference, stop="x:y")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("werk_no_such_module_anywhere:start", "ModuleNotFoundError"),
        ("{module}:missing", "AttributeError"),
        ("{module}:NOT_CALLABLE", "is not callable"),
    ],
)
async def test_a_reference_that_cannot_be_loaded_fails_the_start_clearly(
    lazy_module: str, target: str, words: str
) -> None:
    descriptor = BackendDescriptor(
        name="lazy", start=target.format(module=lazy_module), stop=f"{lazy_module}:stop"
    )
    spec = ModelSpec(id="m", backend="lazy", identity="sha256:" + "0" * 64)
    with pytest.raises(werk.Unavailable, match=words) as caught:
        await descriptor.start_runtime(spec)
    assert not caught.value.retryable
