"""``pip install werk werk-llamacpp`` from wheels gives a working host with exactly that plugin.

The wheels are built from this checkout and installed into a fresh venv that cannot see the
repository (see :mod:`_venvs`). This is what a user installs, so it catches what editable dev
installs hide: a module missing from a wheel, a dependency missing from ``pyproject.toml``, an
entry point that does not resolve, or a bundled plugin that leaks into the host wheel.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from _venvs import LLAMACPP_DIR, REPO_ROOT, CleanVenv, shared_clean_venv

pytestmark = pytest.mark.slow

NOT_INSTALLED = ("werk-vllm", "werk-omlx", "werk-media")

WHERE_SCRIPT = """
import importlib.metadata as md, json, sys, sysconfig
import werk, werk_llamacpp

def origin(dist):
    try:
        d = md.distribution(dist)
    except md.PackageNotFoundError:
        return None
    return {"version": d.version, "direct_url": d.read_text("direct_url.json")}

print(json.dumps({
    "werk": werk.__file__,
    "werk_llamacpp": werk_llamacpp.__file__,
    "purelib": sysconfig.get_paths()["purelib"],
    "prefix": sys.prefix,
    "sys_path": sys.path,
    "dists": {n: origin(n) for n in ("werk", "werk-llamacpp", "werk-vllm", "werk-omlx",
                                      "werk-media")},
}))
"""


def _version(project: Path) -> str:
    with (project / "pyproject.toml").open("rb") as fh:
        return str(tomllib.load(fh)["project"]["version"])


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> CleanVenv:
    return shared_clean_venv(tmp_path_factory)


def test_wheels_are_what_was_built(venv: CleanVenv) -> None:
    assert venv.wheels["werk"].name == f"werk-{_version(REPO_ROOT)}-py3-none-any.whl"
    assert venv.wheels["werk-llamacpp"].name == (
        f"werk_llamacpp-{_version(LLAMACPP_DIR)}-py3-none-any.whl"
    )


def test_werk_imports_from_site_packages_not_the_checkout(venv: CleanVenv) -> None:
    where = venv.python_json(WHERE_SCRIPT)
    purelib = where["purelib"]
    assert where["prefix"] == str(venv.root)
    assert purelib.startswith(str(venv.root))
    assert where["werk"] == f"{purelib}/werk/__init__.py"
    assert where["werk_llamacpp"] == f"{purelib}/werk_llamacpp/__init__.py"
    leaks = [p for p in where["sys_path"] if p.startswith(str(REPO_ROOT))]
    assert leaks == [], f"the clean venv sees the checkout through {leaks}"
    for name in ("werk", "werk-llamacpp"):
        direct_url = where["dists"][name]["direct_url"]
        # pip records a wheel file install as archive_info; an editable one as dir_info.
        assert '"archive_info"' in direct_url and '"editable"' not in direct_url, direct_url
        assert venv.wheels[name].name in direct_url
    for name in NOT_INSTALLED:
        assert where["dists"][name] is None, f"{name} is installed but only two wheels were"


INPROC = "werk-llamacpp:llamacpp-inproc"


def test_werk_plugins_lists_exactly_llamacpp(venv: CleanVenv) -> None:
    rows = venv.werk_json("plugins")["plugins"]
    by_name = {row["name"]: row for row in rows}
    for name in NOT_INSTALLED:
        assert name not in by_name
    # werk-llamacpp's two entry points: llama-server, and llama.cpp in-process
    assert list(by_name) == ["werk-llamacpp", "werk-llamacpp:llamacpp-inproc"], rows
    for name, backend in (("werk-llamacpp", "llamacpp"), (INPROC, "llamacpp-inproc")):
        plugin = by_name[name]
        assert plugin["status"] == "loaded", plugin
        assert plugin["error"] is None
        assert plugin["version"] == _version(LLAMACPP_DIR)
        assert plugin["backends"] == [backend]
        assert "werk_register_backends" in plugin["hooks"]


def test_werk_capabilities_runs_from_the_wheel(venv: CleanVenv) -> None:
    body = venv.werk_json("capabilities")
    rows = body["capabilities"]
    backends = {row["backend"] for row in rows}
    assert backends == {None, "llamacpp", "llamacpp-inproc"}, backends
    host_ids = {row["id"] for row in rows if row["backend"] is None}
    assert "runtime.memory.telemetry.host" in host_ids
    for row in rows:
        assert row["status"] == "supported" or row["reason"], row
