"""werk-vllm's rules without a vLLM process: generated flags, the prefix-cache row over every
active process, inspection caching, and the remote endpoint's configuration.

The live conditions (an enabled, a disabled and a remote vLLM) are created for real in
``test_vllm_serve.py`` and ``test_vllm_remote.py``; the cases here are the combinations that
would need several multi-gigabyte vLLM processes at once (mixed and ambiguous arguments).
The inspection tests run a scripted stand-in *python* that prints what ``_inspect_vllm.py``
prints; it stands for a vLLM installation whose ``--help=all`` lacks a flag, which the
installed vLLM 0.32 cannot show.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest
from werk_vllm import installation
from werk_vllm.plugin import prefix_cache_row
from werk_vllm.process import (
    DISABLE_APC,
    ENABLE_APC,
    PROMPT_DETAILS,
    _startup_failure,
    generated_flags,
    start_runtime,
)
from werk_vllm.remote import configured

from werk import InvalidRequest, ModelSpec, PersistenceDefaults, Reuse, Unavailable

ON = ("--model", "m", ENABLE_APC)
OFF = ("--model", "m", DISABLE_APC)
NEITHER = ("--model", "m")


def test_persistence_defaults_generate_the_apc_switch_unless_the_user_set_one() -> None:
    persistence = PersistenceDefaults()
    assert generated_flags(None, []) == [PROMPT_DETAILS]
    assert generated_flags(persistence, []) == [PROMPT_DETAILS, ENABLE_APC]
    disabled = PersistenceDefaults(reuse=Reuse.DISABLED)
    assert generated_flags(disabled, []) == [PROMPT_DETAILS, DISABLE_APC]
    # An explicit enable or disable in WERK_VLLM_ARGS wins over the server's defaults.
    assert generated_flags(persistence, [DISABLE_APC]) == [PROMPT_DETAILS]
    assert generated_flags(disabled, [ENABLE_APC, "--max-model-len", "512"]) == [PROMPT_DETAILS]


@pytest.mark.parametrize(
    ("local", "remote", "status"),
    [
        ([], False, "unavailable"),
        ([ON], False, "externally_managed"),
        ([ON, ON], False, "externally_managed"),
        ([OFF], False, "unsupported"),
        ([OFF, OFF], False, "unsupported"),
        ([ON, OFF], False, "metadata_only"),  # mixed
        ([NEITHER], False, "metadata_only"),  # ambiguous: vLLM's default decides
        ([ON, NEITHER], False, "metadata_only"),
        ([(*ON, DISABLE_APC)], False, "metadata_only"),  # both flags: ambiguous
        ([ON], True, "metadata_only"),  # an active remote
        ([], True, "metadata_only"),
    ],
)
def test_the_prefix_cache_row_follows_the_seed_over_every_active_vllm(
    local: list[tuple[str, ...]], remote: bool, status: str
) -> None:
    row = prefix_cache_row(local, remote, True, "no active vLLM")
    assert row.status.value == status
    assert row.reason
    assert row.operations == (["automatic_reuse"] if status == "externally_managed" else [])


def test_the_row_says_when_vllm_cannot_isolate_keys() -> None:
    salted = prefix_cache_row([ON], False, True, "")
    assert salted.reason is not None and "per-API-key cache_salt" in salted.reason
    shared = prefix_cache_row([ON], False, False, "")
    assert shared.reason is not None and "API keys share cached blocks" in shared.reason


HELP = """usage: api_server.py [-h] [--enable-prefix-caching | --no-enable-prefix-caching]

options:
  -h, --help            show this help message and exit
  --model MODEL         Name or path (mentions --not-a-flag in prose)
  --enable-prompt-tokens-details, --no-enable-prompt-tokens-details
  --port PORT
"""


def test_advertised_flags_come_from_option_lines_only() -> None:
    flags = installation.advertised_flags(HELP)
    assert {"--model", "--port", PROMPT_DETAILS, "--no-enable-prompt-tokens-details"} <= flags
    assert ENABLE_APC not in flags  # only in the usage block
    assert "--not-a-flag" not in flags


def _stand_in_python(tmp_path: Path, help_text: str) -> tuple[Path, Path]:
    """A script that answers like ``_inspect_vllm.py`` would and counts its runs."""
    runs = tmp_path / "runs"
    package = tmp_path / "vllm" / "__init__.py"
    package.parent.mkdir()
    package.write_text("")
    report = {
        "version": "0.0-standin",
        "package": str(package),
        "cache_salt": {"ChatCompletionRequest": True, "CompletionRequest": True},
        "help": help_text,
    }
    python = tmp_path / "python"
    python.write_text(
        f"#!{sys.executable}\n"
        f"open({str(runs)!r}, 'a').write('x')\n"
        f"print('WERK-INSPECT ' + {json.dumps(json.dumps(report))})\n"
    )
    python.chmod(0o755)
    return python, runs


def test_an_installation_is_inspected_once_until_it_changes(tmp_path: Path) -> None:
    installation.forget_inspections()
    python, runs = _stand_in_python(tmp_path, HELP)
    found = installation.Installation(python, "test")
    first = anyio.run(installation.inspect_vllm, found)
    again = anyio.run(installation.inspect_vllm, found)
    assert first == again and first.version == "0.0-standin" and first.cache_salt
    assert runs.read_text() == "x"  # once
    first.package.write_text("# reinstalled\n")  # vLLM's package changed: inspect again
    anyio.run(installation.inspect_vllm, found)
    assert runs.read_text() == "xx"
    installation.forget_inspections()


def test_a_generated_flag_the_installation_does_not_advertise_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installation.forget_inspections()
    python, _ = _stand_in_python(tmp_path, HELP)  # advertises no --enable-prefix-caching
    monkeypatch.setenv("WERK_VLLM_PYTHON", str(python))
    monkeypatch.setenv("WERK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("WERK_VLLM_ARGS", raising=False)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    spec = ModelSpec(
        id="m",
        backend="vllm",
        identity="sha256:" + "0" * 64,
        files=(model_dir / "config.json",),
        persistence=PersistenceDefaults(),
    )
    with pytest.raises(Unavailable, match="does not advertise --enable-prefix-caching") as caught:
        anyio.run(start_runtime, spec)
    assert not caught.value.retryable
    assert not (tmp_path / "home" / "backends" / "vllm-runs").exists()  # nothing spawned
    installation.forget_inspections()


def test_remote_configuration_errors_are_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WERK_VLLM_HOST", "WERK_VLLM_PORT", "WERK_VLLM_ARGS", "WERK_VLLM_MODEL"):
        monkeypatch.delenv(name, raising=False)
    assert configured() is None
    monkeypatch.setenv("WERK_VLLM_HOST", "127.0.0.1")
    with pytest.raises(InvalidRequest, match="set both"):
        configured()
    monkeypatch.setenv("WERK_VLLM_PORT", "http")
    with pytest.raises(InvalidRequest, match="not a TCP port"):
        configured()
    monkeypatch.setenv("WERK_VLLM_PORT", "8000")
    endpoint = configured()
    assert endpoint is not None and endpoint.base_url == "http://127.0.0.1:8000"
    assert endpoint.salt and endpoint.api_key is None
    monkeypatch.setenv("WERK_VLLM_ARGS", "--enable-prefix-caching")
    with pytest.raises(InvalidRequest, match="Werk starts no process"):
        configured()


def test_a_startup_failure_names_the_reason_pydantic_puts_on_the_next_line() -> None:
    tail = (
        '  File "/venv/lib/python3.11/site-packages/pydantic/_internal/_dataclasses.py", line 1\n'
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "  Value error, User-specified max_model_len (999999) is greater than the derived "
        "max_model_len (max_position_embeddings=2048.0 in /models/tiny/config.json).\n"
        "    For further information visit https://errors.pydantic.dev/2.14/v/value_error\n"
    )
    assert _startup_failure(tail) == (
        "ValidationError: 1 validation error for ModelConfig: Value error, User-specified "
        "max_model_len (999999) is greater than the derived max_model_len "
        "(max_position_embeddings=2048.0 in <path>"
    )
    assert _startup_failure("nothing to see\n") == "no error message in its log"
