"""``werk backends list|install`` and ``werk models create-demo --kind`` through the real
console script, with a plugin installed like a user's (a site directory with a dist-info)
that describes an environment (a tiny local wheel, installed offline) and a demo kind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WERK = Path(sys.executable).parent / "werk"

PLUGIN = textwrap.dedent(
    """
    import os
    from pathlib import Path

    from werk import BackendDescriptor, DemoModel, EnvironmentSpec, hookimpl


    @hookimpl
    def werk_register_backends(register):
        register(BackendDescriptor(name="txt", formats=("txt",)))


    @hookimpl
    def werk_backend_environments():
        return [EnvironmentSpec(name="tiny", description="tiny test env",
                                requirements=(os.environ["TINY_WHEEL"],), imports=("tinypkg",),
                                environment={"PIP_NO_INDEX": "1"})]


    def write(request):
        target = request.output or request.home / "models" / "files" / f"{request.model_id}.txt"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"txt model seed {request.seed}\\n")
        request.progress(f"wrote {target.name}")
        return [target]


    @hookimpl
    def werk_demo_models():
        return [DemoModel(kind="txt", backend="txt", description="a text file", create=write)]
    """
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("site")
    (root / "werk_txt.py").write_text(PLUGIN)
    info = root / "werk_txt-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: werk-txt\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[werk]\ntxt = werk_txt\n")
    return root


def run(*args: str, home: Path, site: Path, wheel: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update(WERK_HOME=str(home), PYTHONPATH=str(site), TINY_WHEEL=str(wheel), NO_COLOR="1")
    return subprocess.run(
        [str(WERK), *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )


def test_list_install_and_list_again(site: Path, tiny_wheel: Path, werk_home: Path) -> None:
    def listed() -> dict[str, dict[str, object]]:
        proc = run("backends", "list", "--json", home=werk_home, site=site, wheel=tiny_wheel)
        assert proc.returncode == 0, proc.stderr
        return {e["name"]: e for e in json.loads(proc.stdout)["environments"]}

    before = listed()["tiny"]
    assert before["state"] == "missing" and before["plugin"] == "werk-txt"
    done = run("backends", "install", "tiny", home=werk_home, site=site, wheel=tiny_wheel)
    assert done.returncode == 0, done.stderr
    assert "[1/4] create the virtual environment" in done.stderr
    assert "[4/4] publish" in done.stderr
    assert done.stdout.startswith(f"installed tiny in {werk_home}/backends/tiny/venv")
    assert listed()["tiny"]["state"] == "ready"
    again = run("backends", "install", "tiny", home=werk_home, site=site, wheel=tiny_wheel)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("tiny is installed and current in ")
    assert "--force rebuilds it" in again.stdout and "[1/4]" not in again.stderr
    forced = run(
        "backends", "install", "tiny", "--force", home=werk_home, site=site, wheel=tiny_wheel
    )
    assert forced.returncode == 0 and "[4/4] publish" in forced.stderr
    assert listed()["tiny"]["state"] == "ready"


def test_install_of_an_unknown_environment_names_the_known_ones(
    site: Path, tiny_wheel: Path, werk_home: Path
) -> None:
    proc = run("backends", "install", "nope", home=werk_home, site=site, wheel=tiny_wheel)
    assert proc.returncode == 1
    assert "no installed plugin describes environment 'nope' (known: " in proc.stderr
    known = proc.stderr.split("(known: ", 1)[1].split(")", 1)[0].split(", ")
    assert "tiny" in known and known == sorted(known)


def test_create_demo_of_a_plugin_kind_imports_it(
    site: Path, tiny_wheel: Path, werk_home: Path
) -> None:
    proc = run(
        "models", "create-demo", "--kind", "txt", "--id", "t1", "--seed", "3",
        home=werk_home, site=site, wheel=tiny_wheel,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "wrote t1.txt" in proc.stderr
    assert proc.stdout.startswith("imported t1 (txt) identity sha256:")
    models = run("models", "list", "--json", home=werk_home, site=site, wheel=tiny_wheel)
    (manifest,) = json.loads(models.stdout)["models"]
    assert manifest["backend"] == "txt"
    assert Path(manifest["files"][0]["path"]).read_text() == "txt model seed 3\n"


def test_create_demo_of_an_unknown_kind_lists_the_kinds(
    site: Path, tiny_wheel: Path, werk_home: Path
) -> None:
    proc = run(
        "models", "create-demo", "--kind", "nope", home=werk_home, site=site, wheel=tiny_wheel
    )
    assert proc.returncode == 1
    assert "no installed plugin offers demo kind 'nope'" in proc.stderr
    assert "gguf (llamacpp:" in proc.stderr and "txt (txt: a text file)" in proc.stderr


def test_a_source_build_is_not_silent_in_a_log(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a terminal (CI, make test) a long source build prints its [n/N] progress once
    per tenth and its own building/reusing/built lines; pip's other lines stay in the log."""
    from werk import InstallStep
    from werk.cli.backends import _StepPrinter

    printer = _StepPrinter()
    printer.tty = False
    printer(InstallStep(2, 5, "build (or reuse) the x wheel"))
    printer(InstallStep(2, 5, "build", "building x==1 from source (takes minutes; log L)"))
    for n in range(1, 141):
        printer(InstallStep(2, 5, "build", f"[{n}/140] g++ -c file{n}.cpp"))
    printer(InstallStep(2, 5, "build", "Collecting something"))
    printer(InstallStep(2, 5, "build", "built x-1.whl in 300.0 s; cached in C"))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "[2/5] build (or reuse) the x wheel"
    assert lines[1].strip().startswith("building x==1")
    steps = [line.split("]")[0].strip() for line in lines if "g++" in line]
    assert steps == [f"[{n}/140" for n in (1, 14, 28, 42, 56, 70, 84, 98, 112, 126, 140)]
    assert lines[-1].strip().startswith("built x-1.whl")
    assert not any("Collecting" in line for line in lines)
