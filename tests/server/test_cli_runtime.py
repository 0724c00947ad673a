"""``werk runtime …`` end to end: the real console script against a real ``werk serve``.

Every CLI call is a subprocess of ``.venv/bin/werk`` with a clean environment (no inherited
``WERK_*``), so option parsing, the bundled client, HTTP on loopback, the server and the exit
status are all exercised exactly as a user meets them. Setup that is not under test (creating
states, reading the store back) goes through raw HTTP so the CLI is never checked by itself.

Three module-scoped servers (testkv backend):

* ``plain`` — unauthenticated local mode, models ``kv`` and ``kv2``, no persistence defaults;
* ``persist`` — the same with ``--persistence`` (server prefill defaults);
* ``keyed`` — API-key mode with two keys (two principals).
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
from _server import WerkServer, free_port
from typer.testing import CliRunner

from werk.cli import app
from werk.cli import runtime as runtime_cli
from werk.cli.runtime.states import parse_duration
from werk.client import DEFAULT_SERVER as CLIENT_DEFAULT_SERVER
from werk.protocol import (
    AuthMode,
    CapabilitiesResponse,
    CapabilityStatus,
    DecodeResponse,
    ErrorBody,
    ErrorCode,
    InfoResponse,
    MemoryResponse,
    PinResult,
    PrefillResponse,
    PruneResult,
    ReuseOutcome,
    StateList,
    StateSummary,
    Tier,
)

WERK = Path(sys.executable).parent / "werk"
KEY_A = "cli-runtime-key-alpha-01"
KEY_B = "cli-runtime-key-bravo-02"
ANSI = "\x1b["
SIX_STATUSES = {s.value for s in CapabilityStatus}

_T = TypeVar("_T")
Spawn = Callable[..., WerkServer]


# -- fixtures and helpers ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain(spawn_server: Spawn) -> WerkServer:
    return spawn_server(models={"kv": "alpha beta gamma delta", "kv2": "one two three four"})


@pytest.fixture(scope="module")
def persist(spawn_server: Spawn) -> WerkServer:
    return spawn_server(args=["--persistence"])


@pytest.fixture(scope="module")
def keyed(spawn_server: Spawn) -> WerkServer:
    return spawn_server(keys=[KEY_A, KEY_B])


@pytest.fixture(scope="module")
def cli_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CLI's own WERK_HOME: never the developer's, and never the server's."""
    return tmp_path_factory.mktemp("cli-home")


def cli_env(home: Path, server: WerkServer | str | None, key: str | None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("WERK_", "PYTEST_")) and k not in ("NO_COLOR", "FORCE_COLOR")
    }
    env["WERK_HOME"] = str(home)
    if server is not None:
        env["WERK_SERVER"] = server if isinstance(server, str) else server.base_url
    if key is not None:
        env["WERK_API_KEY"] = key
    return env


def werk(
    home: Path,
    *args: str,
    server: WerkServer | str | None = None,
    key: str | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``werk ARGS`` (server from ``$WERK_SERVER``, key from ``$WERK_API_KEY``)."""
    proc = subprocess.run(
        [str(WERK), *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        env=cli_env(home, server, key),
        timeout=60,
        check=False,
    )
    # Never a traceback, never colour off a terminal, whatever the outcome.
    assert "Traceback" not in proc.stderr, proc.stderr
    assert ANSI not in proc.stdout and ANSI not in proc.stderr
    return proc


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def parse(proc: subprocess.CompletedProcess[str], type_: type[_T]) -> _T:
    """Exactly one JSON line on stdout, decoded strictly as the protocol Struct."""
    ok(proc)
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    return msgspec.json.decode(lines[0], type=type_)


def failed(proc: subprocess.CompletedProcess[str], code: ErrorCode) -> str:
    """Exit 1 with ``error: <message> (<code>, …)`` on stderr; returns that line."""
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    line = errors[0]
    assert f"({code.value}" in line, line
    return line


def json_failure(proc: subprocess.CompletedProcess[str], code: ErrorCode) -> ErrorBody:
    """``--json`` failure: exit 1 and the protocol error body alone on stdout."""
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    body = msgspec.json.decode(proc.stdout.strip(), type=ErrorBody)
    assert body.error.code is code
    return body


def make_state(server: WerkServer, model: str = "kv", prompt: str = "hello", **kw: Any) -> str:
    """A ready disk state without a live handoff (prefilled and decoded over raw HTTP)."""
    key = kw.pop("key", None)
    with server.client(key) as http:
        response = http.post(
            "/werk/v1/prefill",
            json={
                "model": model,
                "prompt": prompt,
                "policy": {"retention": "disk", **kw},
                "allow_experimental": True,
            },
        )
        assert response.status_code == 200, response.text
        body = response.json()
        decoded = http.post("/werk/v1/decode", json={"handoff": body["handoff"]["token"]})
        assert decoded.status_code == 200, decoded.text
        return str(body["state"]["id"])


def http_states(server: WerkServer, key: str | None = None) -> list[dict[str, Any]]:
    with server.client(key) as http:
        response = http.get("/werk/v1/states")
        assert response.status_code == 200, response.text
        return list(response.json()["states"])


def http_decode_text(server: WerkServer, prompt: str) -> str:
    """What the server itself decodes for ``prompt`` (testkv decoding is deterministic)."""
    with server.client() as http:
        pre = http.post(
            "/werk/v1/prefill", json={"model": "kv", "prompt": prompt, "allow_experimental": True}
        )
        assert pre.status_code == 200, pre.text
        token = pre.json()["handoff"]["token"]
        dec = http.post("/werk/v1/decode", json={"handoff": token, "max_tokens": 8})
        assert dec.status_code == 200, dec.text
        return str(dec.json()["text"])


# -- discovery ---------------------------------------------------------------------------------


def test_info_capabilities_memory_json_are_the_protocol_structs(
    plain: WerkServer, cli_home: Path
) -> None:
    info = parse(werk(cli_home, "runtime", "info", "--json", server=plain), InfoResponse)
    assert info.protocol == "1.0"
    assert info.server.auth is AuthMode.UNAUTHENTICATED_LOCAL
    assert {(m.id, m.backend) for m in info.models} == {("kv", "testkv"), ("kv2", "testkv")}
    assert info.persistence_defaults is None

    # --server on the command line wins over $WERK_SERVER (pointed at nothing here).
    nowhere = f"http://127.0.0.1:{free_port()}"
    caps = parse(
        werk(
            cli_home,
            "runtime",
            "capabilities",
            "--model",
            "kv",
            "--json",
            "--server",
            plain.base_url,
            server=nowhere,
        ),
        CapabilitiesResponse,
    )
    with plain.client() as http:
        direct = msgspec.json.decode(
            http.get("/werk/v1/capabilities", params={"model": "kv"}).content,
            type=CapabilitiesResponse,
        )
    assert caps == direct
    assert {r.model for r in caps.capabilities} <= {"kv", None}
    assert {r.status.value for r in caps.capabilities} <= SIX_STATUSES

    mem = parse(werk(cli_home, "runtime", "memory", "--json", server=plain), MemoryResponse)
    assert mem.host is not None and mem.host.total_bytes > 0


def test_capabilities_table_shows_every_row_and_exact_status(
    plain: WerkServer, cli_home: Path
) -> None:
    with plain.client() as http:  # a live runtime: testkv then reports `experimental` rows
        assert http.post("/werk/v1/models/kv/load", json={}).status_code == 200
    rows = parse(
        werk(cli_home, "runtime", "capabilities", "--json", server=plain), CapabilitiesResponse
    ).capabilities
    text = ok(werk(cli_home, "runtime", "capabilities", server=plain)).stdout
    lines = text.splitlines()
    assert lines[1].split() == ["ID", "STATUS", "BACKEND", "MODEL", "REASON"]
    body = [line.split(maxsplit=4) for line in lines[2:]]
    assert len(body) == len(rows)
    for row, cells in zip(rows, body, strict=True):
        assert cells[:4] == [row.id, row.status.value, row.backend or "-", row.model or "-"]
        if row.reason:
            assert cells[4] == row.reason
    # The testkv model reports several distinct statuses; none is collapsed into another.
    assert {"supported", "experimental", "unsupported", "unavailable"} <= {c[1] for c in body}


def test_info_table_names_server_auth_models_and_plugins(plain: WerkServer, cli_home: Path) -> None:
    text = ok(werk(cli_home, "runtime", "info", server=plain)).stdout
    assert plain.base_url in text
    assert "unauthenticated_local" in text and "not an isolation boundary" in text
    assert "werk-test-backend" in text
    assert any(line.split() == ["kv2", "testkv"] for line in text.splitlines())


def test_memory_watch_count_prints_one_snapshot_per_interval(
    plain: WerkServer, cli_home: Path
) -> None:
    args = ("runtime", "memory", "--watch", "--count", "2", "--interval", "0.2")
    proc = ok(werk(cli_home, *args, "--json", server=plain))
    lines = proc.stdout.splitlines()
    assert len(lines) == 2
    snapshots = [msgspec.json.decode(line, type=MemoryResponse) for line in lines]
    assert all(s.host is not None for s in snapshots)

    table = ok(werk(cli_home, *args, server=plain)).stdout
    assert table.count("Memory at ") == 2
    assert table.count("pressure ") == 2


def test_memory_watch_ctrl_c_exits_zero(plain: WerkServer, cli_home: Path) -> None:
    proc = subprocess.Popen(
        [str(WERK), "runtime", "memory", "--watch", "--interval", "0.2", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=cli_env(cli_home, plain, None),
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        msgspec.json.decode(first, type=MemoryResponse)
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Aborted" not in err
    for line in rest.splitlines():  # anything printed before the signal is a whole snapshot
        msgspec.json.decode(line, type=MemoryResponse)


def _run_in_pty(argv: Sequence[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal as stdin/stdout/stderr; return (status, output)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 140, 0, 0))
    proc = subprocess.Popen(
        list(argv), stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
    )
    os.close(slave)
    chunks: list[bytes] = []
    guard = time.monotonic() + 60  # a hang guard, not a timing assertion
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
            if time.monotonic() > guard:
                proc.kill()
                pytest.fail("werk runtime memory --watch did not finish on a terminal")
        return proc.wait(timeout=30), b"".join(chunks).decode(errors="replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_memory_watch_on_a_terminal_is_a_live_view(plain: WerkServer, cli_home: Path) -> None:
    env = cli_env(cli_home, plain, None)
    env["TERM"] = "xterm-256color"
    status, output = _run_in_pty(
        [str(WERK), "runtime", "memory", "--watch", "--count", "2", "--interval", "0.2"], env
    )
    assert status == 0, output
    assert "Ctrl+C to quit" in output and "pressure" in output
    assert ANSI in output  # styled and redrawn in place, unlike the pipe output above
    assert "Traceback" not in output


# -- prefill / decode --------------------------------------------------------------------------


def test_prefill_then_decode_passing_the_token_between_commands(
    plain: WerkServer, cli_home: Path
) -> None:
    prompt = "the quick brown fox"
    pre = ok(
        werk(
            cli_home,
            "runtime",
            "prefill",
            "--model",
            "kv",
            "--retention",
            "disk",
            "--allow-experimental",
            prompt,
            server=plain,
        )
    )
    token = pre.stdout.strip()
    assert token.startswith("wh_") and "\n" not in token  # the token is all stdout carries
    assert token not in pre.stderr
    assert "state" in pre.stderr and "reuse" in pre.stderr and "prompt tokens" in pre.stderr
    state_id = next(w for w in pre.stderr.split() if w.startswith("st_"))
    assert state_id in {s["id"] for s in http_states(plain)}

    dec = ok(werk(cli_home, "runtime", "decode", token, "--max-tokens", "8", server=plain))
    assert dec.stdout.strip() == http_decode_text(plain, prompt)
    assert "finish:" in dec.stderr and "completion tokens" in dec.stderr

    again = werk(cli_home, "runtime", "decode", token, server=plain)
    line = failed(again, ErrorCode.INVALID_HANDOFF)
    assert "request_id req_" in line
    body = json_failure(
        werk(cli_home, "runtime", "decode", token, "--json", server=plain),
        ErrorCode.INVALID_HANDOFF,
    )
    assert body.error.request_id is not None and body.error.request_id.startswith("req_")


def test_prefill_decode_json_and_prompt_sources(
    plain: WerkServer, cli_home: Path, tmp_path: Path
) -> None:
    prompt = "grüße aus dem prompt\nzweite zeile"
    expected = http_decode_text(plain, prompt)
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(prompt, encoding="utf-8")
    sources: list[tuple[list[str], str | None]] = [
        ([prompt], None),
        (["-"], prompt),
        (["--file", str(prompt_file)], None),
        (["--file", "-"], prompt),
    ]
    tokens = []
    for source, stdin in sources:
        pre = parse(
            werk(
                cli_home,
                "runtime",
                "prefill",
                "--model",
                "kv",
                "--allow-experimental",
                "--json",
                *source,
                server=plain,
                stdin=stdin,
            ),
            PrefillResponse,
        )
        assert pre.state is None  # no policy flags and no server defaults: ephemeral
        assert pre.reuse.outcome is ReuseOutcome.DISABLED
        assert pre.usage.prompt_tokens == len(prompt.encode())  # testkv: one token per byte
        tokens.append(pre.handoff.token)
    # The same prompt arrived from every source: each handoff decodes to the same text.
    dec = parse(
        werk(
            cli_home,
            "runtime",
            "decode",
            "-",
            "--max-tokens",
            "8",
            "--json",
            server=plain,
            stdin=tokens[0] + "\n",
        ),
        DecodeResponse,
    )
    assert dec.text == expected
    with plain.client() as http:
        for token in tokens[1:]:
            response = http.post("/werk/v1/decode", json={"handoff": token, "max_tokens": 8})
            assert response.status_code == 200, response.text
            assert response.json()["text"] == expected


def test_prefill_sends_absent_members_unless_flags_are_given(
    plain: WerkServer, persist: WerkServer, cli_home: Path
) -> None:
    base = ("runtime", "prefill", "--model", "kv", "--json", "hi there")
    # No defaults on `plain`: without an opt-in the experimental capability is refused.
    failed(
        werk(cli_home, "runtime", "prefill", "--model", "kv", "hi there", server=plain),
        ErrorCode.EXPERIMENTAL_OPT_IN_REQUIRED,
    )
    # `persist` defaults (auto retention, experimental opt-in) apply when nothing is sent...
    pre = parse(werk(cli_home, *base, server=persist), PrefillResponse)
    assert pre.state is not None and pre.state.tier is Tier.DISK
    # ...an explicit --no-allow-experimental is never promoted...
    json_failure(
        werk(cli_home, *base, "--no-allow-experimental", server=persist),
        ErrorCode.EXPERIMENTAL_OPT_IN_REQUIRED,
    )
    # ...and any policy flag sends a complete policy (absent members: protocol defaults).
    eph = parse(werk(cli_home, *base, "--reuse", "disabled", server=persist), PrefillResponse)
    assert eph.state is None  # retention defaulted to ephemeral, not to the server's auto
    assert eph.reuse.outcome is ReuseOutcome.DISABLED
    pinned = parse(
        werk(cli_home, *base, "--retention", "disk", "--pin", "--ttl", "600", server=persist),
        PrefillResponse,
    )
    assert pinned.state is not None and pinned.state.pinned
    assert pinned.state.expires_at is not None


# -- states ------------------------------------------------------------------------------------


def test_states_list_filters_and_inspect(plain: WerkServer, cli_home: Path) -> None:
    a = make_state(plain, "kv", "list me one")
    b = make_state(plain, "kv2", "list me two")
    listed = parse(werk(cli_home, "runtime", "states", "list", "--json", server=plain), StateList)
    assert {a, b} <= {s.id for s in listed.states}
    assert [msgspec.to_builtins(s) for s in listed.states] == http_states(plain)

    only_kv2 = parse(
        werk(
            cli_home,
            "runtime",
            "states",
            "list",
            "--model",
            "kv2",
            "--tier",
            "disk",
            "--json",
            server=plain,
        ),
        StateList,
    )
    assert b in {s.id for s in only_kv2.states} and a not in {s.id for s in only_kv2.states}
    assert {(s.model, s.tier) for s in only_kv2.states} == {("kv2", Tier.DISK)}

    table = ok(werk(cli_home, "runtime", "states", "list", server=plain)).stdout
    assert any(line.split()[:3] == [a, "kv", "disk"] for line in table.splitlines())

    summary = parse(
        werk(cli_home, "runtime", "states", "inspect", a, "--json", server=plain), StateSummary
    )
    assert summary == next(s for s in listed.states if s.id == a)
    human = ok(werk(cli_home, "runtime", "states", "inspect", a, server=plain)).stdout
    assert human.splitlines()[0].split() == ["ID", a]
    missing = werk(cli_home, "runtime", "states", "inspect", "st_doesnotexist00", server=plain)
    failed(missing, ErrorCode.NOT_FOUND)


def test_prune_previews_by_default_and_deletes_with_execute(
    plain: WerkServer, cli_home: Path
) -> None:
    victims = [make_state(plain, "kv", f"prune victim {i}") for i in range(2)]
    keeper = make_state(plain, "kv", "prune keeper")
    before = http_states(plain)
    id_args = [arg for v in victims for arg in ("--id", v)]

    preview = parse(
        werk(cli_home, "runtime", "states", "prune", *id_args, "--json", server=plain),
        PruneResult,
    )
    assert preview.dry_run and sorted(preview.selected) == sorted(victims)
    assert preview.deleted == [] and preview.skipped == []
    human = ok(werk(cli_home, "runtime", "states", "prune", *id_args, server=plain)).stdout
    assert "would delete" in human and "--execute" in human
    assert http_states(plain) == before  # previews changed nothing at all

    done = parse(
        werk(cli_home, "runtime", "states", "prune", *id_args, "--execute", "--json", server=plain),
        PruneResult,
    )
    assert not done.dry_run and sorted(done.deleted) == sorted(victims)
    after = {s["id"] for s in http_states(plain)}
    assert not after & set(victims)
    assert keeper in after and after == {s["id"] for s in before} - set(victims)


def test_prune_by_filter_touches_only_matching_states(plain: WerkServer, cli_home: Path) -> None:
    target = make_state(plain, "kv2", "filter target")
    other = make_state(plain, "kv", "filter bystander")
    args = ("runtime", "states", "prune", "--model", "kv2", "--older-than", "0s")
    preview = parse(werk(cli_home, *args, "--json", server=plain), PruneResult)
    assert target in preview.selected and other not in preview.selected
    assert target in {s["id"] for s in http_states(plain)}
    done = ok(werk(cli_home, *args, "--execute", server=plain)).stdout
    assert "deleted" in done.lower()
    remaining = {s["id"] for s in http_states(plain)}
    assert target not in remaining and other in remaining
    assert not any(s["model"] == "kv2" for s in http_states(plain))


def test_pin_previews_then_executes_and_prune_skips_pinned(
    plain: WerkServer, cli_home: Path
) -> None:
    state = make_state(plain, "kv", "pin me")
    preview = parse(
        werk(cli_home, "runtime", "states", "pin", state, "--json", server=plain), PinResult
    )
    assert preview.dry_run and preview.state.pinned  # how it would look
    assert not next(s for s in http_states(plain) if s["id"] == state)["pinned"]
    assert "--execute" in ok(werk(cli_home, "runtime", "states", "pin", state, server=plain)).stdout

    done = parse(
        werk(cli_home, "runtime", "states", "pin", state, "--execute", "--json", server=plain),
        PinResult,
    )
    assert not done.dry_run and done.state.pinned
    assert next(s for s in http_states(plain) if s["id"] == state)["pinned"]
    pinned_only = parse(
        werk(cli_home, "runtime", "states", "list", "--pinned", "--json", server=plain), StateList
    )
    assert state in {s.id for s in pinned_only.states}

    kept = parse(
        werk(
            cli_home,
            "runtime",
            "states",
            "prune",
            "--id",
            state,
            "--execute",
            "--json",
            server=plain,
        ),
        PruneResult,
    )
    assert kept.deleted == [] and [(s.id, s.reason.value) for s in kept.skipped] == [
        (state, "pinned")
    ]
    ok(werk(cli_home, "runtime", "states", "pin", state, "--unpin", "--execute", server=plain))
    assert not next(s for s in http_states(plain) if s["id"] == state)["pinned"]


def test_tier_move_names_the_missing_capability(plain: WerkServer, cli_home: Path) -> None:
    state = make_state(plain, "kv", "tier me")
    line = failed(
        werk(cli_home, "runtime", "states", "tier", state, "--target", "ram", server=plain),
        ErrorCode.UNSUPPORTED,
    )
    assert "capability runtime.state.tier.ram" in line
    body = json_failure(
        werk(
            cli_home,
            "runtime",
            "states",
            "tier",
            state,
            "--target",
            "disk",
            "--json",
            server=plain,
        ),
        ErrorCode.UNSUPPORTED,
    )
    assert body.error.capability == "runtime.state.tier.disk"


def test_prune_all_sends_the_confirmation_and_stays_in_its_principal(
    keyed: WerkServer, cli_home: Path
) -> None:
    mine = [make_state(keyed, "kv", f"all {i}", key=KEY_B) for i in range(2)]
    theirs = make_state(keyed, "kv", "other principal", key=KEY_A)
    # The server refuses `all` without `confirm: "all"`, so a successful preview proves the CLI
    # sent it; the preview deletes nothing.
    preview = parse(
        werk(cli_home, "runtime", "states", "prune", "--all", "--json", server=keyed, key=KEY_B),
        PruneResult,
    )
    assert preview.dry_run and sorted(preview.selected) == sorted(mine)
    assert {s["id"] for s in http_states(keyed, KEY_B)} == set(mine)
    done = parse(
        werk(
            cli_home,
            "runtime",
            "states",
            "prune",
            "--all",
            "--execute",
            "--json",
            server=keyed,
            key=KEY_B,
        ),
        PruneResult,
    )
    assert sorted(done.deleted) == sorted(mine)
    assert http_states(keyed, KEY_B) == []
    assert theirs in {s["id"] for s in http_states(keyed, KEY_A)}


# -- experts -----------------------------------------------------------------------------------


def test_experts_report_unsupported_with_the_capability(plain: WerkServer, cli_home: Path) -> None:
    line = failed(
        werk(cli_home, "runtime", "experts", "--model", "kv", server=plain), ErrorCode.UNSUPPORTED
    )
    assert "capability runtime.experts.residency" in line
    body = json_failure(
        werk(
            cli_home,
            "runtime",
            "experts",
            "evict",
            "--model",
            "kv",
            "e0",
            "e1",
            "--allow-experimental",
            "--json",
            server=plain,
        ),
        ErrorCode.UNSUPPORTED,
    )
    assert body.error.capability == "runtime.experts.residency"
    assert body.error.request_id is not None and body.error.request_id.startswith("req_")


# -- authentication and transport --------------------------------------------------------------


def test_api_key_from_environment_or_file(
    keyed: WerkServer, cli_home: Path, tmp_path: Path
) -> None:
    info = parse(werk(cli_home, "runtime", "info", "--json", server=keyed, key=KEY_A), InfoResponse)
    assert info.server.auth is AuthMode.API_KEY

    missing = werk(cli_home, "runtime", "info", server=keyed)
    failed(missing, ErrorCode.UNAUTHENTICATED)
    wrong = werk(cli_home, "runtime", "states", "list", "--json", server=keyed, key=KEY_A + "x")
    json_failure(wrong, ErrorCode.UNAUTHENTICATED)
    assert KEY_A not in wrong.stdout + wrong.stderr

    key_file = tmp_path / "key"
    key_file.write_text(f"# my werk key\n\n  {KEY_A}  \n")
    # The file's first key is used, and it wins over the environment.
    ok(werk(cli_home, "runtime", "memory", "--api-key-file", str(key_file), server=keyed, key="no"))


def test_key_file_without_a_key_is_a_usage_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("# nothing here\n\n")
    result = CliRunner().invoke(
        app,
        ["runtime", "info", "--api-key-file", str(empty)],
        env={"WERK_SERVER": f"http://127.0.0.1:{free_port()}"},
    )
    assert result.exit_code == 2, result.output
    assert "contains no key" in result.output


def test_unreachable_server_is_a_clear_error(cli_home: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    proc = werk(cli_home, "runtime", "states", "list", server=nowhere)
    line = failed(proc, ErrorCode.UNAVAILABLE)
    assert "cannot reach the Werk server" in line
    assert nowhere in proc.stderr  # the hint names where it looked
    assert proc.stdout == ""
    body = json_failure(
        werk(cli_home, "runtime", "info", "--json", server=nowhere), ErrorCode.UNAVAILABLE
    )
    assert "cannot reach the Werk server" in body.error.message
    assert body.error.request_id is None  # no server ever answered


USAGE_ERRORS = [
    ["runtime", "info", "--no-such-option"],
    ["runtime", "info", "--server", "https://127.0.0.1:1"],
    ["runtime", "info", "--server", "http://127.0.0.1:1/path"],
    ["runtime", "prefill", "hello"],  # --model missing
    ["runtime", "prefill", "--model", "kv"],  # no prompt
    ["runtime", "prefill", "--model", "kv", "--file", "/dev/null", "hello"],  # two prompts
    ["runtime", "prefill", "--model", "kv", "--file", "/nonexistent/prompt"],
    ["runtime", "prefill", "--model", "kv", "--ttl", "0", "hello"],
    ["runtime", "prefill", "--model", "kv", "--retention", "forever", "hello"],
    ["runtime", "decode"],
    ["runtime", "decode", "wh_x", "--temperature", "3"],
    ["runtime", "memory", "--count", "2"],  # --count without --watch
    ["runtime", "memory", "--watch", "--interval", "0"],
    ["runtime", "states", "list", "--tier", "attic"],
    ["runtime", "states", "prune"],  # no selector
    ["runtime", "states", "prune", "--id", "st_abcdefgh", "--model", "kv"],  # two selectors
    ["runtime", "states", "prune", "--all", "--expired"],
    ["runtime", "states", "prune", "--older-than", "soon"],
    ["runtime", "states", "prune", "--older-than", "99999d"],  # over ten years
    ["runtime", "states", "tier", "st_abcdefgh"],  # --target missing
    ["runtime", "experts"],  # neither --model nor a sub-command
    ["runtime", "experts", "--model", "kv", "evict", "--model", "kv", "e0"],
    ["runtime", "experts", "prefetch", "--model", "kv"],  # no expert ids
    ["runtime", "info", "--api-key-file", "/nonexistent/key"],
]


@pytest.mark.parametrize("args", USAGE_ERRORS, ids=" ".join)
def test_usage_errors_exit_2_before_any_request(args: list[str]) -> None:
    """In process (the same typer app the script runs), against a port nobody listens on:
    any request would be exit 1 (`unavailable`), so exit 2 proves it was refused first."""
    result = CliRunner().invoke(
        app, args, env={"WERK_SERVER": f"http://127.0.0.1:{free_port()}", "WERK_API_KEY": ""}
    )
    assert result.exit_code == 2, f"{args}: exit {result.exit_code}\n{result.output}"
    assert "Error" in result.output


def test_usage_error_exit_status_of_the_real_script(cli_home: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    proc = werk(
        cli_home, "runtime", "states", "prune", "--id", "st_abcdefgh", "--all", server=nowhere
    )
    assert proc.returncode == 2, proc.stderr
    assert "Usage:" in proc.stderr and proc.stdout == ""


def test_help_texts_teach_the_commands() -> None:
    def help_of(*args: str) -> str:
        result = CliRunner().invoke(app, [*args, "--help"])
        assert result.exit_code == 0, result.output
        return " ".join(result.output.split())

    top = help_of("runtime")
    for command in ("info", "capabilities", "memory", "states", "prefill", "decode", "experts"):
        assert f" {command} " in top
    assert "WERK_API_KEY" in top and "--execute" in top and "Exit codes" in top
    for args in (("states", "prune"), ("states", "pin"), ("states", "tier")):
        assert "PREVIEWS unless --execute" in help_of("runtime", *args), args
    assert "--execute" in help_of("runtime", "experts", "prefetch")
    assert "Ctrl+C" in help_of("runtime", "memory")
    assert "shown exactly once" in help_of("runtime", "prefill")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0),
        ("3600", 3600),
        ("3600s", 3600),
        ("30m", 1800),
        ("1h", 3600),
        ("2d", 172800),
        ("1h30m", 5400),
        ("1H", 3600),
    ],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


def test_bundled_default_server_matches_the_client() -> None:
    assert runtime_cli.DEFAULT_SERVER == CLIENT_DEFAULT_SERVER


def test_memory_view_never_shows_unobserved_as_zero(capsys: pytest.CaptureFixture[str]) -> None:
    base = {
        "sampled_at": "2026-01-01T00:00:00Z",
        "unified": False,
        "host": None,
        "managed": {},
        "pressure": "unknown",
        "counters": {},
    }
    gpu = {"index": 0, "name": "H200", "total_bytes": None, "used_bytes": None}
    unobserved = msgspec.convert({**base, "accelerators": [gpu]}, MemoryResponse)
    runtime_cli.show(runtime_cli.render_memory(unobserved))
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    assert rows["host"].split()[1:] == ["not", "observed"] * 3
    assert rows["gpu0"].count("not observed") == 3 and " 0 B" not in rows["gpu0"]
    assert rows["pressure"].split() == ["pressure", "unknown"]

    for accelerators, shown in (([], "none present"), (None, "could not sample")):
        sampled = msgspec.convert({**base, "accelerators": accelerators}, MemoryResponse)
        runtime_cli.show(runtime_cli.render_memory(sampled))
        assert shown in capsys.readouterr().out
