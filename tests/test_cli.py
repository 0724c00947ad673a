"""The real ``werk`` console script, run as a subprocess exactly as a user runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from _model_dirs import write_safetensors

import werk
from werk.protocol import CapabilitiesResponse, ErrorBody, PluginInfo, PluginStatus, decode

BIN = Path(sys.executable).parent
WERK = shutil.which("werk", path=str(BIN))
BUNDLED = {
    "werk-llamacpp": ["llamacpp"],
    "werk-media": ["media", "qwen-tts"],
    "werk-omlx": ["omlx"],
    "werk-vllm": ["vllm", "vllm-remote"],
}
SIX_STATUSES = {
    "supported",
    "unsupported",
    "unavailable",
    "experimental",
    "externally_managed",
    "metadata_only",
}

pytestmark = pytest.mark.skipif(WERK is None, reason="the werk console script is not installed")


class PluginList(msgspec.Struct):
    plugins: list[PluginInfo]


def run(*args: str, home: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update({"WERK_HOME": str(home), "NO_COLOR": "1", "COLUMNS": "200", **extra_env})
    assert WERK is not None
    return subprocess.run(
        [WERK, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def run_script(
    script: str, *args: str, home: Path, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    """``python -c SCRIPT ARGS`` with :func:`run`'s environment (e.g. :data:`WHOLE_TREE`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update({"WERK_HOME": str(home), "NO_COLOR": "1", "COLUMNS": "200", **extra_env})
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_version(werk_home: Path) -> None:
    proc = run("--version", home=werk_home)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"werk {werk.__version__} (protocol {werk.PROTOCOL_VERSION})"


def test_plugins_json_lists_the_bundled_plugins(werk_home: Path) -> None:
    proc = run("plugins", "--json", home=werk_home)
    assert proc.returncode == 0, proc.stderr
    rows = {p.name: p for p in decode(proc.stdout, PluginList).plugins}
    assert set(BUNDLED) <= set(rows)
    for name, backends in BUNDLED.items():
        row = rows[name]
        assert row.status is PluginStatus.LOADED, row.error
        assert row.error is None
        assert row.version
        assert row.backends == backends
        assert {"werk_register_backends", "werk_capabilities"} <= set(row.hooks)
        assert all(h.startswith("werk_") for h in row.hooks)


def test_plugins_table_for_people(werk_home: Path) -> None:
    proc = run("plugins", home=werk_home)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if "NAME" in line)
    for column in ("NAME", "VERSION", "STATUS", "BACKENDS", "HOOKS", "ERROR"):
        assert column in header
    for name in BUNDLED:
        (line,) = [ln for ln in lines if ln.split() and ln.split()[0] == name]
        assert "loaded" in line.split()
    assert "\x1b[" not in proc.stdout  # no colour codes when stdout is not a terminal


def test_plugins_respects_load_plugins(werk_home: Path) -> None:
    proc = run("plugins", "--json", home=werk_home, WERK_LOAD_PLUGINS="")
    assert proc.returncode == 0, proc.stderr
    assert decode(proc.stdout, PluginList).plugins == []
    proc = run("plugins", "--json", home=werk_home, WERK_LOAD_PLUGINS="werk-vllm")
    assert [p.name for p in decode(proc.stdout, PluginList).plugins] == ["werk-vllm"]


def test_capabilities_json(werk_home: Path) -> None:
    proc = run("capabilities", "--json", home=werk_home)
    assert proc.returncode == 0, proc.stderr
    response = decode(proc.stdout, CapabilitiesResponse)
    assert response.protocol == werk.PROTOCOL_VERSION
    rows = response.capabilities
    assert {r.status.value for r in rows} <= SIX_STATUSES
    assert all(r.reason for r in rows if r.status.value != "supported")
    host = {r.id: r for r in rows if r.backend is None}
    assert {"runtime.memory.telemetry.host", "runtime.memory.telemetry.accelerator"} <= set(host)
    assert {r.backend for r in rows if r.backend} >= {b for bs in BUNDLED.values() for b in bs}


def test_capabilities_table(werk_home: Path) -> None:
    proc = run("capabilities", home=werk_home)
    assert proc.returncode == 0, proc.stderr
    assert "runtime.memory.telemetry.host" in proc.stdout
    assert "runtime.model_residency" in proc.stdout


def test_capabilities_unknown_model(werk_home: Path) -> None:
    proc = run("capabilities", "--model", "nope", home=werk_home)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert "error:" in proc.stderr and "nope" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_capabilities_unknown_model_json(werk_home: Path) -> None:
    proc = run("capabilities", "--model", "nope", "--json", home=werk_home)
    assert proc.returncode == 1
    body = decode(proc.stdout, ErrorBody)
    assert body.error.code == "not_found"
    assert "nope" in body.error.message
    assert body.error.retryable is False


@pytest.mark.parametrize(
    "args",
    [("--bogus",), ("plugins", "--bogus"), ("capabilities", "--model"), ("no-such-command",)],
    ids=["root-option", "command-option", "missing-value", "unknown-command"],
)
def test_usage_errors_exit_2(args: tuple[str, ...], werk_home: Path) -> None:
    proc = run(*args, home=werk_home)
    assert proc.returncode == 2
    assert "Usage:" in proc.stderr or "Error" in proc.stderr


def test_read_only_commands_create_no_files(werk_home: Path) -> None:
    for args in (("plugins",), ("capabilities", "--json"), ("jobs", "list")):
        assert run(*args, home=werk_home).returncode == 0
    assert list(werk_home.iterdir()) == []


# -- plugin commands (werk_register_commands) --------------------------------------------------

COMMANDS_PLUGIN = """
from werk import hookimpl


@hookimpl
def werk_register_commands(app, models):
    @app.command("hello")
    def hello(name: str = "world") -> None:
        print(f"hello {name} from a plugin")

    @models.command("count-demo")
    def count_demo() -> None:
        print("0 demo models")
"""

BROKEN_COMMANDS_PLUGIN = """
from werk import hookimpl


@hookimpl
def werk_register_commands(app, models):
    raise RuntimeError("cannot add commands today")
"""


def _site_with(tmp_path: Path, **modules: str) -> Path:
    """A directory with real ``*.dist-info`` entries: importlib.metadata finds the plugins."""
    site = tmp_path / "site"
    site.mkdir()
    for module, source in modules.items():
        (site / f"{module}.py").write_text(source)
        info = site / f"{module}-0.0.1.dist-info"
        info.mkdir()
        dist = module.replace("_", "-")
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0.1\n")
        (info / "entry_points.txt").write_text(f"[werk]\n{dist} = {module}\n")
    return site


def test_plugin_adds_commands(tmp_path: Path, werk_home: Path) -> None:
    site = _site_with(tmp_path, werk_cmds=COMMANDS_PLUGIN)
    proc = run("hello", "--name", "tester", home=werk_home, PYTHONPATH=str(site))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "hello tester from a plugin"
    proc = run("models", "count-demo", home=werk_home, PYTHONPATH=str(site))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "0 demo models"
    listed = run("plugins", "--json", home=werk_home, PYTHONPATH=str(site))
    row = {p.name: p for p in decode(listed.stdout, PluginList).plugins}["werk-cmds"]
    assert row.status is PluginStatus.LOADED
    assert "werk_register_commands" in row.hooks


def test_plugin_failing_to_add_commands_does_not_break_the_cli(
    tmp_path: Path, werk_home: Path
) -> None:
    site = _site_with(tmp_path, werk_cmds=COMMANDS_PLUGIN, werk_broken=BROKEN_COMMANDS_PLUGIN)
    proc = run("hello", home=werk_home, PYTHONPATH=str(site))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "hello world from a plugin"
    assert "werk-broken" in proc.stderr and "cannot add commands today" in proc.stderr
    assert run("--version", home=werk_home, PYTHONPATH=str(site)).returncode == 0


def test_without_the_plugin_the_command_does_not_exist(werk_home: Path) -> None:
    assert run("hello", home=werk_home).returncode == 2


BROKEN_IMPORT_PLUGIN = "raise ImportError('werk_badimport needs a library that is missing')\n"


def test_a_plugin_that_fails_to_import_warns_once_and_explains_with_v(
    tmp_path: Path, werk_home: Path
) -> None:
    site = _site_with(tmp_path, werk_badimport=BROKEN_IMPORT_PLUGIN)
    proc = run("plugins", home=werk_home, PYTHONPATH=str(site))
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "werk-badimport" in line]
    assert len(warnings) == 1, proc.stderr  # once per command, though two managers are built
    assert "Traceback" not in proc.stderr
    verbose = run("plugins", "-v", home=werk_home, PYTHONPATH=str(site))
    assert "Traceback (most recent call last)" in verbose.stderr
    assert "needs a library that is missing" in verbose.stderr


def test_tables_follow_columns_in_a_pipe(werk_home: Path) -> None:
    narrow = run("capabilities", home=werk_home, COLUMNS="80")
    assert narrow.returncode == 0, narrow.stderr
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80


def test_serve_help_names_its_values() -> None:
    assert WERK is not None
    env = {**os.environ, "COLUMNS": "120"}
    proc = subprocess.run(
        [WERK, "serve", "--help"], capture_output=True, text=True, env=env, timeout=60, check=True
    )
    for option in (
        "--model ID",
        "--host HOST",
        "--port PORT",
        "--api-key KEY",
        "--api-key-file PATH",
    ):
        assert option in proc.stdout, proc.stdout
    assert "list[str]" not in proc.stdout and "<str>" not in proc.stdout
    assert "int range" not in proc.stdout


def test_an_endpoint_backend_imports_a_model_without_files(werk_home: Path, tmp_path: Path) -> None:
    done = run(
        "models", "import", "--backend", "vllm-remote", "--id", "far", "--json", home=werk_home
    )
    assert done.returncode == 0, done.stderr
    manifest = msgspec.json.decode(done.stdout)
    assert (manifest["id"], manifest["backend"], manifest["files"]) == ("far", "vllm-remote", [])
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    refused = {
        "takes no files": ("models", "import", str(model), "--backend", "vllm-remote", "--id", "x"),
        "needs model files": ("models", "import", "--backend", "llamacpp", "--id", "x"),
        "cannot infer the backend": ("models", "import", "--id", "x"),
    }
    for message, args in refused.items():
        failed = run(*args, home=werk_home)
        assert failed.returncode == 1 and message in failed.stderr, (args, failed.stderr)
    assert [m.name for m in (werk_home / "models").glob("*.json")] == ["far.json"]
    no_id = run("models", "import", str(model), home=werk_home)
    assert no_id.returncode == 2 and "only --from can derive one" in no_id.stderr


def test_a_model_directory_is_imported_with_every_file_under_it(
    werk_home: Path, tmp_path: Path
) -> None:
    pipeline = tmp_path / "sd"
    (pipeline / "unet").mkdir(parents=True)
    (pipeline / "model_index.json").write_text('{"_class_name": "StableDiffusionPipeline"}')
    (pipeline / "unet" / "config.json").write_text("{}")
    write_safetensors(pipeline / "unet" / "weights.safetensors", {"w": ("F16", (4, 8))})
    (pipeline / ".cache").mkdir()
    (pipeline / ".cache" / "lock").write_text("skipped")
    done = run("models", "import", str(pipeline), "--id", "sd", "--json", home=werk_home)
    assert done.returncode == 0, done.stderr
    manifest = msgspec.json.decode(done.stdout)
    assert manifest["backend"] == "media"  # model_index.json: a Diffusers pipeline
    relative = sorted(str(Path(f["path"]).relative_to(pipeline)) for f in manifest["files"])
    assert relative == ["model_index.json", "unet/config.json", "unet/weights.safetensors"]
    llm = tmp_path / "llm"
    llm.mkdir()
    (llm / "config.json").write_text("{}")
    (llm / "model.bin").write_bytes(b"\0" * 64)
    ambiguous = run("models", "import", str(llm), "--id", "llm", home=werk_home)
    assert ambiguous.returncode == 1
    hf = sorted(
        name
        for name, d in werk.get_plugin_manager().backends.items()
        if {"hf", "transformers"} & set(d.formats)
    )
    assert {"media", "transformers", "vllm"} <= set(hf)  # the bundled ones that take it
    assert f"can be served by {', '.join(hf)}; pass --backend" in ambiguous.stderr
    chosen = run("models", "import", str(llm), "--id", "llm", "--backend", "vllm", home=werk_home)
    assert chosen.returncode == 0, chosen.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = run("models", "import", str(empty), "--id", "e", home=werk_home)
    assert refused.returncode == 1 and "not a model" in refused.stderr


def test_jobs_list_and_show_read_the_records_of_every_principal(werk_home: Path) -> None:
    from werk.protocol import JobStatus
    from werk.state.jobs import JobStore

    ticks = iter(range(1_800_000_000, 1_800_000_100))
    store = JobStore(werk_home, clock=lambda: float(next(ticks)))
    mine = store.create("p_alpha", "audio.speech", {"model": "tts", "input": "hi"})
    output = store.save_output(mine.id, b"RIFF", "audio/wav")
    store.update(mine.id, status=JobStatus.COMPLETED, output=output)
    theirs = store.create("p_bravo", "images.generations", {"model": "img", "prompt": "x"})
    listed = msgspec.json.decode(run("jobs", "list", "--json", home=werk_home).stdout)["jobs"]
    assert [(j["id"], j["principal"], j["status"]) for j in listed] == [
        (mine.id, "p_alpha", "completed"),
        (theirs.id, "p_bravo", "queued"),
    ]
    table = run("jobs", "list", home=werk_home).stdout
    assert mine.id in table and "audio/wav, 4 B" in table
    shown = msgspec.json.decode(run("jobs", "show", mine.id, "--json", home=werk_home).stdout)
    assert shown["output"]["url"] == f"/v1/outputs/{output.id}"
    missing = run("jobs", "show", "job_nope", home=werk_home)
    assert missing.returncode == 1 and "no job 'job_nope'" in missing.stderr


WHOLE_TREE = (
    "import sys; from werk.cli import app, register_plugin_commands; "
    "register_plugin_commands(); sys.argv[0] = 'werk'; app()"
)


@pytest.mark.parametrize(
    "args",
    [
        ("serve", "--help"),
        ("plugins", "--help"),
        ("serve", "--nope"),
        ("runtime", "--help"),
        ("jobs", "list", "--help"),
        ("ps", "--help"),
    ],
)
def test_an_own_command_is_built_alone_and_behaves_the_same(
    args: tuple[str, ...], tmp_path: Path, werk_home: Path
) -> None:
    """``werk serve ...`` (any of Werk's own top-level commands or groups named first) imports its
    module only and builds that command alone, for start-up time: the plugins' commands are not
    loaded (a plugin that fails to add them is not even asked), and the help, the output and
    the exit status are those of the whole command tree."""
    site = _site_with(tmp_path, werk_broken=BROKEN_COMMANDS_PLUGIN)
    alone = run(*args, home=werk_home, PYTHONPATH=str(site))
    whole = run_script(WHOLE_TREE, *args, home=werk_home, PYTHONPATH=str(site))
    assert "cannot add commands today" in whole.stderr  # the whole tree asked the plugin
    assert "cannot add commands today" not in alone.stderr
    assert (alone.returncode, alone.stdout) == (whole.returncode, whole.stdout)
    assert alone.stderr == whole.stderr.split("\n", 1)[1]  # all but the plugin's warning


def test_the_command_line_imports_no_runtime_stack() -> None:
    """``werk --help`` imports every command module: none of them may pull in an event loop, the
    HTTP stack, an HTTP client or a table renderer at import time (each costs tens of
    milliseconds of every command's start; docs/performance.md, "CLI start-up")."""
    heavy = ("asyncio", "anyio", "uvicorn", "starlette", "httpx", "rich", "psutil", "pydantic")
    probe = (
        f"import sys; from werk.cli import app; print(sorted(set({heavy!r}) & set(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_the_command_module_table_matches_the_whole_tree() -> None:
    """``werk.cli.main`` imports only the module its table names for the command given: the
    table must name every own top-level command and group, and the module that registers it."""
    probe = (
        "import json, sys\n"
        "from werk.cli import OWN_COMMAND_MODULES, app\n"
        "from werk.cli import _name_of\n"
        "found = {}\n"
        "for info in app.registered_commands:\n"
        "    found[_name_of(info)] = [info.callback.__module__]\n"
        "for group in app.registered_groups:\n"
        "    commands = group.typer_instance.registered_commands\n"
        "    found[group.name] = sorted({c.callback.__module__ for c in commands})\n"
        "print(json.dumps([found, OWN_COMMAND_MODULES]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    found, table = msgspec.json.decode(done.stdout)
    assert set(found) == set(table)
    for name, modules in found.items():
        package = f"werk.cli.{table[name]}"
        assert all(m == package or m.startswith(package + ".") for m in modules), (name, modules)


def test_import_werk_cli_imports_no_command_module() -> None:
    probe = "import sys, werk.cli; print(sorted(m for m in sys.modules if 'werk.cli.' in m))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "['werk.cli._gc', 'werk.cli.plugin_commands']"


WERK_MAIN = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('PLUGINS', sorted(m for m in sys.modules"
    " if m.startswith('werk_')), file=sys.stderr))\n"
    "sys.argv[0] = 'werk'\n"
    "from werk.cli import main\n"
    "main()\n"
)


def _werk_main(
    *args: str, home: Path, **extra_env: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``werk ARGS`` in-process through :func:`werk.cli.main`, and the plugin modules it
    imported (printed at exit)."""
    done = run_script(WERK_MAIN, *args, home=home, **extra_env)
    marker = [line for line in done.stderr.splitlines() if line.startswith("PLUGINS ")]
    assert marker, done.stderr
    imported = msgspec.json.decode(marker[-1].removeprefix("PLUGINS ").replace("'", '"'))
    return done, imported


def test_help_skips_the_plugins_once_the_index_says_they_add_no_commands(
    tmp_path: Path, werk_home: Path
) -> None:
    """The first ``werk --help`` loads every plugin and records that none adds commands; the
    next ones (and ``werk models list``) import no plugin, with the same output."""
    cache = tmp_path / "cache"
    first, imported = _werk_main("--help", home=werk_home, WERK_CACHE_DIR=str(cache))
    assert first.returncode == 0 and "werk_llamacpp" in " ".join(imported)
    (index,) = msgspec.json.decode((cache / "plugin-commands.json").read_bytes())["entries"]
    assert index["adds_commands"] is False
    assert (cache / "plugin-commands.json").stat().st_mode & 0o777 == 0o600
    again, imported = _werk_main("--help", home=werk_home, WERK_CACHE_DIR=str(cache))
    assert imported == [] and (again.returncode, again.stdout) == (0, first.stdout)
    models, imported = _werk_main("models", "list", home=werk_home, WERK_CACHE_DIR=str(cache))
    assert models.returncode == 0 and imported == []
    # The console script sees another import path (its bin directory first): a second entry.
    assert run("--help", home=werk_home, WERK_CACHE_DIR=str(cache)).stdout == first.stdout
    entries = msgspec.json.decode((cache / "plugin-commands.json").read_bytes())["entries"]
    assert len(entries) == 2
    _, imported = _werk_main("--help", home=werk_home, WERK_CACHE_DIR=str(cache))
    assert imported == []
    # A name Werk does not know loads them (it may be a plugin's command): the typo's answer.
    typo, imported = _werk_main("srve", home=werk_home, WERK_CACHE_DIR=str(cache))
    assert typo.returncode == 2 and "No such command" in typo.stderr and imported


def test_a_new_plugin_with_commands_is_seen_despite_the_index(
    tmp_path: Path, werk_home: Path
) -> None:
    """The index is keyed by the import path and its directories' times: a site that adds a
    plugin with commands makes ``werk --help`` load the plugins and list the command; the index
    then says plugins add commands, so later runs load them too."""
    cache = tmp_path / "cache"
    _werk_main("--help", home=werk_home, WERK_CACHE_DIR=str(cache))
    site = _site_with(tmp_path, werk_cmds=COMMANDS_PLUGIN)
    for _ in range(2):
        shown, imported = _werk_main(
            "--help", home=werk_home, WERK_CACHE_DIR=str(cache), PYTHONPATH=str(site)
        )
        assert shown.returncode == 0 and "hello" in shown.stdout and "werk_cmds" in imported
    entries = msgspec.json.decode((cache / "plugin-commands.json").read_bytes())["entries"]
    assert [e["adds_commands"] for e in entries] == [True, False]  # newest first


def test_a_stale_or_corrupt_index_never_hides_a_plugin_command(
    tmp_path: Path, werk_home: Path
) -> None:
    """An index that says "no plugin commands" for this very key (an editable plugin that
    gained commands without a version change) still lets the plugin's commands run: a name Werk
    does not know loads the plugins, at the top level and under ``werk models``. A corrupt
    index is ignored."""
    cache = tmp_path / "cache"
    site = _site_with(tmp_path, werk_cmds=COMMANDS_PLUGIN)
    env = {"WERK_CACHE_DIR": str(cache), "PYTHONPATH": str(site)}
    _werk_main("--help", home=werk_home, **env)
    index = cache / "plugin-commands.json"
    stale = msgspec.json.decode(index.read_bytes())
    stale["entries"][0]["adds_commands"] = False
    index.write_bytes(msgspec.json.encode(stale))
    hello, _ = _werk_main("hello", "--name", "x", home=werk_home, **env)
    assert (hello.returncode, hello.stdout.strip()) == (0, "hello x from a plugin")
    index.write_bytes(msgspec.json.encode(stale))
    count, _ = _werk_main("models", "count-demo", home=werk_home, **env)
    assert (count.returncode, count.stdout.strip()) == (0, "0 demo models")
    index.write_bytes(b"{not json")
    shown, imported = _werk_main("--help", home=werk_home, **env)
    assert shown.returncode == 0 and "hello" in shown.stdout and "werk_cmds" in imported


@pytest.mark.parametrize("args", [("--help",), ()])
def test_the_top_level_help_from_the_listing_equals_the_whole_trees(
    args: tuple[str, ...], tmp_path: Path, werk_home: Path
) -> None:
    """With no plugin adding commands, ``werk --help`` and ``werk`` are printed from a listing
    of parameterless stand-ins (no command's options are converted): byte for byte the whole
    tree's help and exit status."""
    cache = str(tmp_path / "cache")
    _werk_main("--help", home=werk_home, WERK_CACHE_DIR=cache)  # writes the plugin index
    listed, imported = _werk_main(*args, home=werk_home, WERK_CACHE_DIR=cache)
    assert imported == []  # the listing path: the index said no plugin adds commands
    whole = run_script(WHOLE_TREE, *args, home=werk_home)
    assert "Commands:" in whole.stdout + whole.stderr and "serve" in whole.stdout + whole.stderr
    assert (listed.returncode, listed.stdout) == (whole.returncode, whole.stdout)
    assert listed.stderr.split("PLUGINS")[0] == whole.stderr


def test_the_index_keys_on_the_plugin_managers_own_allow_list_variable() -> None:
    """``werk.cli.plugin_index`` repeats ``WERK_LOAD_PLUGINS``'s name so as not to import the
    plugin manager; the two must not drift apart."""
    from werk.cli import plugin_index
    from werk.plugins import LOAD_ENV

    assert plugin_index.LOAD_ENV == LOAD_ENV
