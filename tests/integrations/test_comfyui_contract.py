"""The node pack's contract with ComfyUI, without ComfyUI: the V1 node attributes ComfyUI reads,
its link rule (restated from Comfy-Org/ComfyUI 0.3.64 ``comfy_execution/validation.py``), the
handoff's privacy under every way ComfyUI turns a value into text, the experimental opt-in, and
the registry's ``pyproject.toml`` rules (docs.comfy.org/registry/specifications)."""

from __future__ import annotations

import copy
import inspect
import json
import math
import os
import pickle
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import werk_comfy
from _integration_support import PACK
from werk_comfy.client import WerkNodeError, WerkServer, redact
from werk_comfy.handoff import HANDOFF_TYPE, WerkStateHandoff
from werk_comfy.system import ANY

TOKEN = "wh_0123456789abcdefABCDEF-_secret"
SINGLE_USE = {"WerkPrefill", "WerkDecode", "WerkNamedState"}
LIVE = {"WerkMemory", "WerkUnload", "WerkExpertsPrefetch", "WerkExpertsEvict"}
ALL_NODES, ALL_NAMES = werk_comfy.node_mappings(experimental=True)


@pytest.fixture(autouse=True)
def _no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropdowns ask the server of the environment: here, none (a closed port)."""
    monkeypatch.setenv("WERK_URL", "http://127.0.0.1:9")


def validate_node_input(received_type: Any, input_type: Any, strict: bool = False) -> bool:
    """ComfyUI's link rule, as ``comfy_execution/validation.py`` states it."""
    if not received_type != input_type:  # noqa: SIM202 - a "*" type answers through __ne__
        return True
    if not isinstance(received_type, str) or not isinstance(input_type, str):
        return False
    received = {t.strip() for t in received_type.split(",")}
    accepted = {t.strip() for t in input_type.split(",")}
    return received.issubset(accepted) if strict else bool(received & accepted)


def preview_any(source: Any) -> str:
    """What core ``PreviewAny`` (``comfy_extras/nodes_preview_any.py``) writes into the
    history for a value linked to it."""
    if isinstance(source, str):
        return source
    if isinstance(source, (int, float, bool)):
        return str(source)
    try:
        return json.dumps(source)
    except Exception:
        try:
            return str(source)
        except Exception:
            return "source exists, but could not be serialized."


def format_value(x: Any) -> Any:
    """``execution.py``'s ``format_value``: how a failed node's inputs reach
    ``execution_error.current_inputs``."""
    if x is None or isinstance(x, (int, float, bool, str)):
        return x
    return str(x)


def _handoff() -> WerkStateHandoff:
    return WerkStateHandoff(
        TOKEN, model="demo", expires_at="2026-12-06T00:15:00Z", server=None, state_id="st_x"
    )


def _inputs(node: type[Any]) -> dict[str, Any]:
    spec = node.INPUT_TYPES()
    return {**spec.get("required", {}), **spec.get("optional", {})}


@pytest.mark.parametrize("name", sorted(ALL_NODES))
def test_every_node_has_what_comfyui_reads(name: str) -> None:
    node = ALL_NODES[name]
    assert ALL_NAMES[name].startswith("Werk ")
    assert node.CATEGORY.startswith("Werk")
    assert isinstance(node.RETURN_TYPES, tuple)
    assert len(node.RETURN_NAMES) == len(node.RETURN_TYPES)
    spec = node.INPUT_TYPES()
    assert set(spec) <= {"required", "optional", "hidden"}
    for socket in _inputs(node).values():
        kind = socket[0]
        assert isinstance(kind, (str, list)), socket  # a type string or a dropdown
    # ComfyUI calls FUNCTION with the inputs as keyword arguments: every input is a parameter.
    params = inspect.signature(getattr(node, node.FUNCTION)).parameters
    wanted = set(_inputs(node)) | set(spec.get("hidden", {}))
    assert wanted == set(params) - {"self"}, (wanted, set(params))
    for param in params.values():
        if param.name in spec.get("optional", {}) or param.name in spec.get("hidden", {}):
            assert param.default is not inspect.Parameter.empty, param.name


def test_the_node_types_and_categories() -> None:
    types = {name: node.RETURN_TYPES for name, node in ALL_NODES.items()}
    assert types["WerkChat"] == ("STRING",)
    assert types["WerkPrefill"] == (HANDOFF_TYPE,)
    assert types["WerkNamedState"] == (HANDOFF_TYPE, "STRING", "STRING")
    assert types["WerkDecode"] == ("STRING",)
    assert _inputs(ALL_NODES["WerkDecode"])["handoff"][0] == HANDOFF_TYPE
    assert types["WerkSpeech"] == ("AUDIO",)
    assert types["WerkImage"] == ("IMAGE",)
    assert types["WerkMemory"] == ("STRING",)
    assert types["WerkServer"] == ("WERK_SERVER",)
    categories = {node.CATEGORY for node in ALL_NODES.values()}
    assert categories == {
        "Werk", "Werk/LLM", "Werk/State", "Werk/Media", "Werk/System",
        "Werk/Experts (experimental)",
    }  # fmt: skip


def test_single_use_and_live_nodes_always_run() -> None:
    for name, node in ALL_NODES.items():
        changed = getattr(node, "IS_CHANGED", None)
        if name in SINGLE_USE | LIVE:
            value = changed()
            assert isinstance(value, float)
            assert math.isnan(value)
            assert value != value
        else:
            assert changed is None, name  # cached by ComfyUI while the inputs are unchanged


def test_a_handoff_output_links_only_to_a_handoff_input() -> None:
    every_input = [
        (name, input_name, socket[0])
        for name, node in ALL_NODES.items()
        for input_name, socket in _inputs(node).items()
        if isinstance(socket[0], str)
    ]
    for node, input_name, kind in every_input:
        linked = validate_node_input(HANDOFF_TYPE, kind)
        assert linked == (kind in (HANDOFF_TYPE, ANY)), (node, input_name, kind)
    for kind in ("STRING", "JSON", "STRING,JSON", "INT", "*,STRING"):  # plain strings
        assert not validate_node_input(HANDOFF_TYPE, kind)
    assert validate_node_input(HANDOFF_TYPE, HANDOFF_TYPE)
    assert validate_node_input(HANDOFF_TYPE, ANY)  # an "any" socket: Preview Any, Unload
    assert validate_node_input("STRING", ANY) and validate_node_input(ANY, "IMAGE")


def test_a_handoff_never_shows_its_token() -> None:
    handoff = _handoff()
    for text in (str(handoff), repr(handoff), f"{handoff}", f"{handoff!r}", f"{handoff:>80}"):
        assert TOKEN not in text and "wh_" not in text
        assert "token hidden" in text
    with pytest.raises(TypeError):
        json.dumps(handoff)
    with pytest.raises(TypeError):
        json.dumps({"handoff": handoff})
    assert TOKEN not in preview_any(handoff) and "token hidden" in preview_any(handoff)
    assert TOKEN not in str(format_value(handoff))
    for copier in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError):
            copier(handoff)
    with pytest.raises(TypeError):
        vars(handoff)  # the token is a private slot, not in a __dict__ a node could dump


def test_a_handoff_is_spent_once() -> None:
    handoff = _handoff()
    assert handoff.spend() == TOKEN
    assert handoff.spent and "used" in str(handoff)
    with pytest.raises(WerkNodeError) as second:
        handoff.spend()
    assert second.value.code == "invalid_handoff" and TOKEN not in str(second.value)


def test_errors_and_the_server_connection_hide_secrets() -> None:
    error = WerkNodeError("backend_error", f"failed for {TOKEN} in the backend")
    assert TOKEN not in str(error) and "wh_…" in str(error)
    assert redact(f"a {TOKEN}, b {TOKEN}") == "a wh_…, b wh_…"
    server = WerkServer.from_environment("http://127.0.0.1:1", "sk-very-secret-key")
    for text in (str(server), repr(server), format_value(server), preview_any(server)):
        assert "sk-very-secret-key" not in text
    with pytest.raises(TypeError):
        pickle.dumps(server)
    with pytest.raises(WerkNodeError, match="not an http"):
        WerkServer.from_environment("ftp://x")


def test_an_unreachable_server_is_a_clear_error_and_an_honest_dropdown() -> None:
    with pytest.raises(WerkNodeError) as failed:
        werk_comfy.NODE_CLASS_MAPPINGS["WerkMemory"]().read()
    assert failed.value.code == "unreachable" and "werk serve" in str(failed.value)
    (entry,) = werk_comfy.NODE_CLASS_MAPPINGS["WerkChat"].INPUT_TYPES()["required"]["model"][0]
    assert entry.startswith("<no model list")
    assert werk_comfy.NODE_CLASS_MAPPINGS["WerkChat"].VALIDATE_INPUTS(entry) != True  # noqa: E712
    assert werk_comfy.NODE_CLASS_MAPPINGS["WerkChat"].VALIDATE_INPUTS("saved-model") is True


@pytest.mark.parametrize(("value", "present"), [("", False), ("0", False), ("1", True)])
def test_expert_nodes_exist_only_with_the_opt_in(value: str, present: bool) -> None:
    env = {**os.environ, "WERK_COMFY_EXPERIMENTAL": value}
    probe = "import werk_comfy; print(sorted(werk_comfy.NODE_CLASS_MAPPINGS))"
    listed = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert ("WerkExpertsPrefetch" in listed) is present
    assert ("WerkExpertsEvict" in listed) is present
    assert "WerkChat" in listed
    if present:
        assert ALL_NODES["WerkExpertsPrefetch"].EXPERIMENTAL is True


def test_the_pack_folder_loads_as_comfyui_loads_it(tmp_path: Path) -> None:
    """``nodes.load_custom_node``: the folder's ``__init__.py`` under a module name that is
    the folder's path, its mappings read from that module."""
    probe = (
        "import importlib.util, sys\n"
        f"path = {str(PACK)!r}\n"
        "name = path.replace('.', '_x_')\n"
        "spec = importlib.util.spec_from_file_location(name, path + '/__init__.py')\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules[name] = module\n"
        "spec.loader.exec_module(module)\n"
        "print(sorted(module.NODE_CLASS_MAPPINGS), len(module.NODE_DISPLAY_NAME_MAPPINGS))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "WERK_COMFY_EXPERIMENTAL"}
    loaded = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert loaded.returncode == 0, loaded.stderr
    assert "'WerkChat'" in loaded.stdout and loaded.stdout.strip().endswith(" 9")


_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:[-_.][A-Za-z0-9]+)*$")


def test_the_pyproject_follows_the_registry_specification() -> None:
    config = tomllib.loads((PACK / "pyproject.toml").read_text())
    project, comfy = config["project"], config["tool"]["comfy"]
    name = project["name"]
    assert len(name) < 100 and _NAME.match(name) and "comfyui" not in name.lower()
    assert re.fullmatch(r"\d+\.\d+\.\d+", project["version"])
    assert project["version"] == werk_comfy.__version__
    license_ = project["license"]
    assert isinstance(license_, dict) and set(license_) <= {"file", "text"}
    if "file" in license_:
        assert (PACK / license_["file"]).is_file()
    assert project["urls"]["Repository"].startswith("https://")
    assert comfy["PublisherId"] and comfy["DisplayName"]
    assert project["dependencies"] == []  # ComfyUI's environment has what the nodes use


@pytest.mark.slow
def test_the_pack_builds_as_a_wheel(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", tmp_path, PACK],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = tmp_path.glob("werk_nodes-0.1.0-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "werk_comfy/handoff.py" in names and "werk_comfy/__init__.py" in names
    assert "Name: werk-nodes" in metadata and "Project-URL: Repository" in metadata
