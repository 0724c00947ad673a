"""The argument builder, help parsing, option validation, inspection and executable search.

Fast: help texts are written in llama.cpp's own layout (copied from this build's ``--help``);
inspection runs real stand-in executables (shell scripts), never a mock.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from werk_llamacpp import inspect as llama_inspect
from werk_llamacpp.args import (
    ARGS_ENV,
    RESERVED_FLAGS,
    LaunchOptions,
    build_args,
    parse_options,
    state_blockers,
)
from werk_llamacpp.executable import locate_llama_server
from werk_llamacpp.inspect import (
    ExecutableChanged,
    FileIdentity,
    Inspection,
    advertised_flags,
    inspect_executable,
    inspect_executable_sync,
    verify_unchanged,
)

from werk import CapabilityContext, InvalidRequest, ModelSpec, Unavailable


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# Lines exactly as llama-server (build 11434) prints them, including the multi-space gap after
# "-a," and a spec that wraps onto its own line.
FULL_HELP = """\
----- common params -----

-h,    --help, --usage                  print usage and exit
--version                               show version and build info
-c,    --ctx-size N                     size of the prompt context (default: 0, 0 = loaded from mode
                                        (env: LLAMA_ARG_CTX_SIZE)
-cram, --cache-ram N                    set the maximum cache size in MiB (default: 8192, -1 - no li
                                        disable)[(more
--warmup, --no-warmup                   whether to perform warmup with an empty run (default: enable
-np,   --parallel N                     number of server slots (default: -1, -1 = auto)
-lm,   --load-mode MODE                 model loading mode (default: auto)
-m,    --model FNAME                    model path to load
-a,    --alias STRING                   set model name aliases, comma-separated (to be used by API)
--host HOST                             IP addresses to listen on, comma-separated, or UNIX socket p
--port PORT                             port to listen (default: 8080)
--reuse-port                            allow multiple sockets to bind to the same port (default: di
--path PATH                             path to serve static files from (default: )
--ui-config-file, --webui-config-file PATH
                                        JSON file that provides default UI settings (overrides UI de
--ui,  --webui, --no-ui, --no-webui     whether to enable the Web UI (default: enabled)
--api-key KEY                           API key to use for authentication, multiple keys can be prov
--api-key-file FNAME                    path to file containing API keys, one per line; lines starti
--slot-save-path PATH                   path to save slot kv cache (default: disabled)
-t,    --threads N                      number of CPU threads to use during generation (default: -1)
"""

# An old runtime: network flags only (no slots, no warmup or RAM-cache controls).
OLD_HELP = """\
-m,    --model FNAME                    model path to load
--host HOST                             ip address to listen (default: 127.0.0.1)
--port PORT                             port to listen (default: 8080)
--api-key KEY                           API key to use for authentication (default: none)
-c,    --ctx-size N                     size of the prompt context
"""


def inspection_of(help_text: str, *, problems: tuple[str, ...] = ()) -> Inspection:
    flags = advertised_flags(help_text)
    essential = {"--model": ("-m", "--model")}
    missing = tuple(
        f for f in llama_inspect.ESSENTIAL_FLAGS if not flags & set(essential.get(f, (f,)))
    )
    return Inspection(
        path=Path("/nonexistent/llama-server"),
        identity=FileIdentity("/nonexistent/llama-server", 0, 0, 0, 0, 0),
        sha256="0" * 64,
        help_text=help_text,
        version_text="version: 1 (test)",
        flags=flags,
        problems=problems,
        missing_essential=missing,
    )


def build(
    help_text: str = FULL_HELP,
    options: LaunchOptions | None = None,
    problems: tuple[str, ...] = (),
) -> tuple[tuple[str, ...], tuple[str, ...], list[str]]:
    inspection = inspection_of(help_text, problems=problems)
    built = build_args(
        inspection,
        model=Path("/models/demo.gguf"),
        port=40001,
        api_key="SECRET-KEY",
        slot_dir=Path("/home/w/backends/llamacpp/g_1/slots"),
        alias="demo",
        options=options or LaunchOptions(),
    )
    return built.argv, built.public, state_blockers(built, inspection)


# -- help parsing -----------------------------------------------------------------------------


def test_help_parsing_reads_every_spelling() -> None:
    flags = advertised_flags(FULL_HELP)
    for flag in ("-a", "--alias", "-c", "--ctx-size", "-np", "--parallel", "-cram", "--cache-ram"):
        assert flag in flags, flag
    for flag in ("--warmup", "--no-warmup", "--no-ui", "--no-webui", "--ui-config-file"):
        assert flag in flags, flag
    assert "--webui-config-file" in flags and "--usage" in flags
    # Words of descriptions and metavars are not flags.
    assert not flags & {"N", "PATH", "FNAME", "-", "--no-mmap", "disable)[(more"}


def test_help_parsing_of_the_real_executable() -> None:
    located = locate_llama_server()
    if located.path is None:
        pytest.skip(f"no llama-server executable ({located.reason})")
    inspection = inspect_executable_sync(located.path)
    assert inspection.valid, inspection.problems
    assert inspection.missing_essential == ()
    for flag in ("--slot-save-path", "--cache-ram", "--no-warmup", "--parallel", "--alias"):
        assert flag in inspection.flags
    assert "--no-mmap" not in inspection.flags  # this build replaced it with --load-mode
    assert inspection.sha256 == hashlib.sha256(located.path.read_bytes()).hexdigest()
    assert inspection.version != "unknown"


# -- the command line -------------------------------------------------------------------------


def test_full_command_line() -> None:
    argv, public, blockers = build()
    assert argv == (
        *("-m", "/models/demo.gguf", "--host", "127.0.0.1", "--port", "40001"),
        *("--api-key", "SECRET-KEY"),
        *("--slot-save-path", "/home/w/backends/llamacpp/g_1/slots"),
        *("-np", "5", "--cache-ram", "0", "--no-warmup", "-c", "20480"),
        *("--alias", "demo", "--no-ui"),
    )
    assert public == (
        *("-m", "<model>", "--host", "127.0.0.1", "--port", "<port>", "--api-key", "<api-key>"),
        *("--slot-save-path", "<slot-dir>", "-np", "5", "--cache-ram", "0", "--no-warmup"),
        *("-c", "20480", "--alias", "demo", "--no-ui"),
    )
    assert blockers == []


def test_public_args_hold_no_secret_path_or_port() -> None:
    _, public, _ = build()
    text = " ".join(public)
    assert "SECRET-KEY" not in text and "40001" not in text and "/" not in text


def test_redacted_args_keep_the_slot_dir_but_not_the_key() -> None:
    inspection = inspection_of(FULL_HELP)
    built = build_args(
        inspection,
        model=Path("/m.gguf"),
        port=1,
        api_key="SECRET-KEY",
        slot_dir=Path("/s"),
        alias="demo",
        options=LaunchOptions(),
    )
    redacted = built.redacted()
    assert "SECRET-KEY" not in redacted and "SECRET-KEY" in built.argv
    assert redacted[redacted.index("--slot-save-path") + 1] == "/s"


def test_only_advertised_flags_are_emitted() -> None:
    argv, public, blockers = build(OLD_HELP, problems=("--help does not advertise --parallel",))
    assert public == (
        *("-m", "<model>", "--host", "127.0.0.1", "--port", "<port>", "--api-key", "<api-key>"),
        *("-c", "4096"),  # one slot: the context is not multiplied
    )
    for absent in ("--no-warmup", "--warmup", "--cache-ram", "--slot-save-path", "-np", "--alias"):
        assert absent not in argv
    assert any("no private --slot-save-path" in b for b in blockers)
    assert any(b.startswith("inspection:") for b in blockers)


def test_missing_essential_flags_refuse_to_start() -> None:
    help_text = "\n".join(line for line in OLD_HELP.splitlines() if "--api-key" not in line)
    with pytest.raises(Unavailable, match="--api-key"):
        build(help_text)


@pytest.mark.parametrize(
    ("warmup_tokens", "native", "expected"),
    [
        (0, (), ["--no-warmup"]),
        (512, (), ["--warmup"]),
        (0, ("--warmup",), ["--no-warmup", "--warmup"]),  # trailing native args win
        (64, ("--no-warmup",), ["--warmup", "--no-warmup"]),
    ],
)
def test_warmup(warmup_tokens: int, native: tuple[str, ...], expected: list[str]) -> None:
    argv, _, _ = build(options=LaunchOptions(warmup_tokens=warmup_tokens, native_args=native))
    assert [a for a in argv if a in ("--warmup", "--no-warmup")] == expected
    assert argv[len(argv) - len(native) :] == native


def test_runtime_without_warmup_controls_keeps_its_default() -> None:
    help_text = "\n".join(line for line in FULL_HELP.splitlines() if "warmup" not in line)
    for tokens in (0, 100):
        argv, _, _ = build(help_text, LaunchOptions(warmup_tokens=tokens))
        assert "--warmup" not in argv and "--no-warmup" not in argv


def test_native_args_follow_werks_and_may_override_defaults() -> None:
    native = ("-c", "8192", "-t", "2", "--path", "/srv/static", "--alias", "other")
    argv, public, _ = build(options=LaunchOptions(native_args=native))
    assert argv[-len(native) :] == native and public[-len(native) :] == native


@pytest.mark.parametrize(
    "native",
    [
        ["--host", "0.0.0.0"],
        ["--port", "8080"],
        ["--port=8080"],
        ["--api-key", "mine"],
        ["--api_key", "mine"],
        ["--api-key-file", "/tmp/keys"],
        ["--slot-save-path", "/tmp/elsewhere"],
        ["--slot_save_path", "/tmp/elsewhere"],
        ["--reuse-port"],
        ["-m", "/other.gguf"],
        ["--model", "/other.gguf"],
        ["-hf", "someone/model"],
        ["--api-prefix", "/x"],
        ["--ssl-cert-file", "/c.pem"],
        ["-t", "2", "--host", "127.0.0.2"],
    ],
)
def test_reserved_native_args_are_rejected(native: list[str]) -> None:
    with pytest.raises(InvalidRequest) as caught:
        build(options=LaunchOptions(native_args=tuple(native)))
    message = caught.value.message
    offending = next(a for a in native if a.startswith("-") and a not in ("-t",))
    assert repr(offending.split("=")[0]) in message
    assert "not allowed" in message and "Werk sets" in message


def test_every_reserved_flag_is_rejected_in_every_spelling() -> None:
    for flag in RESERVED_FLAGS:
        spellings = (
            {flag, flag.replace("-", "_").replace("__", "--", 1)} if flag[1] == "-" else {flag}
        )
        for spelling in spellings:
            with pytest.raises(InvalidRequest, match="not allowed"):
                build(options=LaunchOptions(native_args=(spelling, "x")))


def test_unadvertised_and_name_value_native_args_are_rejected() -> None:
    with pytest.raises(InvalidRequest, match=r"'--no-mmap' is not an option"):
        build(options=LaunchOptions(native_args=("--no-mmap",)))
    with pytest.raises(InvalidRequest, match="NAME=VALUE"):
        build(options=LaunchOptions(native_args=("--threads=2",)))
    argv, _, _ = build(options=LaunchOptions(native_args=("-t", "-1")))  # "-1" is a value
    assert argv[-2:] == ("-t", "-1")


def test_native_ram_cache_override_disables_named_states() -> None:
    _, _, blockers = build(options=LaunchOptions(native_args=("-cram", "1024")))
    assert blockers == ["the native arguments re-enable the host-RAM prompt cache (--cache-ram)"]
    _, _, blockers = build(options=LaunchOptions(native_args=("--cache-ram", "0")))
    assert blockers == []


# -- model options ----------------------------------------------------------------------------


def test_options_defaults_and_env_args_come_last() -> None:
    env = {ARGS_ENV: "-t 2 --alias 'a b'"}
    parsed = parse_options({"native_args": ["-c", "1024"], "warmup_tokens": 3}, env)
    assert parsed.native_args == ("-c", "1024", "-t", "2", "--alias", "a b")
    assert parsed.warmup_tokens == 3 and parsed.parallel == 4 and parsed.ctx_size == 4096
    assert parse_options({}, {}).native_args == ()


@pytest.mark.parametrize(
    ("options", "env", "match"),
    [
        ({"llama_args": []}, {}, "unknown llama.cpp model option"),
        ({"native_args": "-t 2"}, {}, "list of strings"),
        ({"native_args": ["-t", 2]}, {}, "list of strings"),
        ({"warmup_tokens": -1}, {}, "warmup_tokens"),
        ({"warmup_tokens": True}, {}, "warmup_tokens"),
        ({"parallel": 0}, {}, "parallel"),
        ({"ctx_size": "4096"}, {}, "ctx_size"),
        ({"startup_timeout": 0}, {}, "startup_timeout"),
        ({}, {ARGS_ENV: "-t '2"}, "shell syntax"),
    ],
)
def test_bad_options_are_rejected(
    options: dict[str, object], env: dict[str, str], match: str
) -> None:
    with pytest.raises(InvalidRequest, match=match):
        parse_options(options, env)


# -- inspection of a stand-in executable ------------------------------------------------------


def stand_in(
    path: Path, *, help_text: str = FULL_HELP, version_rc: int = 0, devices: str = "  (none)"
) -> Path:
    """A real executable printing ``help_text``; each run appends a line to ``<path>.runs``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "help.txt").write_text(help_text)
    path.write_text(
        "#!/bin/sh\n"
        f'echo "$1" >> "{path}.runs"\n'
        'case "$1" in\n'
        f'  --help) cat "{path.parent}/help.txt" ;;\n'
        f'  --version) echo "version: 7 (stand-in)" >&2; exit {version_rc} ;;\n'
        f'  --list-devices) printf "Available devices:\\n{devices}\\n" ;;\n'
        "  *) exit 3 ;;\n"
        "esac\n"
    )
    path.chmod(0o755)
    return path


def runs(path: Path) -> list[str]:
    return Path(f"{path}.runs").read_text().split()


@pytest.mark.anyio
async def test_inspection_runs_once_per_identity(tmp_path: Path) -> None:
    llama_inspect.forget_inspections()
    exe = stand_in(tmp_path / "bin" / "llama-server")
    first = await inspect_executable(exe)
    assert first.valid and first.missing_essential == ()
    assert first.sha256 == hashlib.sha256(exe.read_bytes()).hexdigest()
    assert first.version == "7 (stand-in)"
    assert first.devices == ()  # a CPU-only build
    assert sorted(runs(exe)) == ["--help", "--list-devices", "--version"]
    assert await inspect_executable(exe) is first
    assert inspect_executable_sync(exe) is first
    assert sorted(runs(exe)) == ["--help", "--list-devices", "--version"]  # cached
    # A new identity (content and mtime change) is inspected again.
    exe.write_text(exe.read_text() + "# changed\n")
    second = await inspect_executable(exe)
    assert second is not first and second.sha256 != first.sha256
    assert sorted(runs(exe)).count("--help") == 2


@pytest.mark.anyio
async def test_inspection_lists_the_accelerator_devices(tmp_path: Path) -> None:
    llama_inspect.forget_inspections()
    gpu = stand_in(
        tmp_path / "gpu" / "llama-server",
        devices="  CUDA0: NVIDIA H200 (143771 MiB, 143252 MiB free)",
    )
    assert (await inspect_executable(gpu)).devices == (
        "CUDA0: NVIDIA H200 (143771 MiB, 143252 MiB free)",
    )
    llama_inspect.forget_inspections()
    assert inspect_executable_sync(gpu).devices == (
        "CUDA0: NVIDIA H200 (143771 MiB, 143252 MiB free)",
    )  # from the disk cache: the device list is part of the stored outputs
    old = stand_in(tmp_path / "old" / "llama-server", devices="")
    (old.parent / "llama-server").write_text(
        old.read_text().replace("--list-devices)", "--never-matches)")
    )
    result = await inspect_executable(old)
    assert result.valid and result.devices is None  # no device list: unknown, not "none"


@pytest.mark.anyio
async def test_failed_version_makes_the_inspection_invalid(tmp_path: Path) -> None:
    llama_inspect.forget_inspections()
    exe = stand_in(tmp_path / "llama-server", version_rc=1)
    result = await inspect_executable(exe)
    assert not result.valid and result.missing_essential == ()
    assert any("--version" in p for p in result.problems)
    await inspect_executable(exe)
    assert runs(exe).count("--help") == 2  # an invalid inspection is not cached


@pytest.mark.anyio
async def test_inspection_without_slot_flags_is_invalid_but_startable(tmp_path: Path) -> None:
    llama_inspect.forget_inspections()
    result = await inspect_executable(stand_in(tmp_path / "llama-server", help_text=OLD_HELP))
    assert result.missing_essential == ()
    assert result.problems == ("--help does not advertise --slot-save-path, --parallel",)


@pytest.mark.anyio
async def test_verify_unchanged_detects_a_replaced_binary(tmp_path: Path) -> None:
    llama_inspect.forget_inspections()
    exe = stand_in(tmp_path / "llama-server")
    result = await inspect_executable(exe)
    await verify_unchanged(result)  # unchanged: no error
    stat = exe.stat()
    data = bytearray(exe.read_bytes())
    data[-2:-1] = b"#"  # same size, different bytes, mtime restored
    exe.write_bytes(bytes(data))
    os.utime(exe, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ExecutableChanged, match="changed while the model was starting"):
        await verify_unchanged(result)


@pytest.mark.anyio
async def test_a_valid_inspection_is_reused_from_disk_by_the_next_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_HOME", str(tmp_path / "home"))
    llama_inspect.forget_inspections()
    exe = stand_in(tmp_path / "bin" / "llama-server")
    first = await inspect_executable(exe)
    [cached] = list(llama_inspect.inspection_dir().iterdir())
    assert cached.stat().st_mode & 0o777 == 0o600
    llama_inspect.forget_inspections()  # what a new process starts with
    again = await inspect_executable(exe)
    assert again == first and sorted(runs(exe)) == ["--help", "--list-devices", "--version"]
    llama_inspect.forget_inspections()
    assert inspect_executable_sync(exe) == first and len(runs(exe)) == 3  # nothing ran
    # A corrupt entry is ignored (the executable runs again) and replaced.
    cached.write_text("{not json")
    llama_inspect.forget_inspections()
    assert await inspect_executable(exe) == first and len(runs(exe)) == 6
    llama_inspect.forget_inspections()
    assert await inspect_executable(exe) == first and len(runs(exe)) == 6
    # Another identity (here: a copy at another path) is inspected anew.
    copy = tmp_path / "other" / "llama-server"
    copy.parent.mkdir()
    copy.write_bytes(exe.read_bytes())
    copy.chmod(0o755)
    assert (await inspect_executable(copy)).sha256 == first.sha256
    assert len(list(llama_inspect.inspection_dir().iterdir())) == 2


@pytest.mark.anyio
async def test_an_invalid_inspection_is_not_written_and_a_changed_binary_drops_its_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_HOME", str(tmp_path / "home"))
    llama_inspect.forget_inspections()
    await inspect_executable(stand_in(tmp_path / "bad" / "llama-server", version_rc=1))
    assert not llama_inspect.inspection_dir().exists()
    exe = stand_in(tmp_path / "good" / "llama-server")
    result = await inspect_executable(exe)
    assert len(list(llama_inspect.inspection_dir().iterdir())) == 1
    stat = exe.stat()
    data = bytearray(exe.read_bytes())
    data[-2:-1] = b"#"
    exe.write_bytes(bytes(data))
    os.utime(exe, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ExecutableChanged):
        await verify_unchanged(result, llama_inspect.start_rehash(result))
    assert list(llama_inspect.inspection_dir().iterdir()) == []


# -- locating the executable ------------------------------------------------------------------


@pytest.fixture
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.delenv("WERK_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("WERK_BUILD_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_build_cache_versions_sort_numerically(nowhere: Path) -> None:
    for version in ("9999.0.0", "11434.0.0", "11434.0.0-rc", "2.0.0"):
        stand_in(nowhere / "llama-server" / version / "bin" / "llama-server")
    located = locate_llama_server()
    assert located.path is not None and located.path.parts[-3] == "11434.0.0-rc"
    (nowhere / "llama-server" / "11434.0.0-rc" / "bin" / "llama-server").unlink()
    located = locate_llama_server()
    assert located.path is not None and located.path.parts[-3] == "11434.0.0"


def test_model_option_names_the_executable(
    nowhere: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configured = stand_in(tmp_path / "opt" / "llama-server")
    on_path = stand_in(tmp_path / "path" / "llama-server")
    monkeypatch.setenv("PATH", str(on_path.parent))
    located = locate_llama_server({"llama_server": str(configured)})
    assert located.path == configured and located.reason == "from model option llama_server"
    assert locate_llama_server({}).path == on_path
    bad = locate_llama_server({"llama_server": str(tmp_path / "missing")})
    assert bad.path is None and "is not an executable file" in bad.reason
    assert locate_llama_server({"llama_server": 5}).path is None
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(on_path))  # the environment wins
    assert locate_llama_server({"llama_server": str(configured)}).path == on_path


# -- residency truth uses the same checks ------------------------------------------------------


def residency(options: dict[str, object]) -> tuple[str, str]:
    from werk_llamacpp import plugin

    spec = ModelSpec(id="m", backend="llamacpp", identity="sha256:" + "2" * 64, options=options)
    (row,) = [
        r
        for r in plugin.werk_capabilities(CapabilityContext(backend="llamacpp", model=spec))
        if r.id == "runtime.model_residency"
    ]
    return row.status.value, row.reason or ""


def test_residency_reports_what_a_start_would_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llama_inspect.forget_inspections()
    exe = stand_in(tmp_path / "bin" / "llama-server")
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(exe))
    monkeypatch.delenv(ARGS_ENV, raising=False)
    status, reason = residency({})
    assert status == "supported" and "7 (stand-in)" in reason, reason
    assert residency({"native_args": ["--port", "1"]}) == (
        "unavailable",
        "native llama-server argument '--port' is not allowed: Werk sets the port of the "
        "processes it manages",
    )
    assert residency({"ctx_size": 1})[0] == "unavailable"
    monkeypatch.setenv(ARGS_ENV, "--host 0.0.0.0")
    status, reason = residency({})
    assert status == "unavailable" and "'--host' is not allowed" in reason
    monkeypatch.delenv(ARGS_ENV)
    old = stand_in(tmp_path / "old" / "llama-server", help_text="--port PORT    port\n")
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(old))
    status, reason = residency({})
    assert status == "unavailable" and "does not advertise --model, --host, --api-key" in reason
