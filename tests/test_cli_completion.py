"""Shell completion through a real bash: ``werk completion bash`` (or click's
``_WERK_COMPLETE=bash_source``) gives a script that completes commands and options."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from werk.testing.server import WERK

BASH = shutil.which("bash")


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WERK_", "_WERK"))}
    env["WERK_HOME"] = str(tmp_path / "home")
    env["PATH"] = f"{WERK.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _complete(tmp_path: Path, source: str, *words: str) -> list[str]:
    script = (
        f"{source}\n"
        f"COMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}\n"
        "_werk_completion werk\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    assert BASH is not None
    done = subprocess.run(
        [BASH, "--norc", "-c", script],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
@pytest.mark.parametrize(
    "source", ['eval "$(werk completion bash)"', 'eval "$(_WERK_COMPLETE=bash_source werk)"']
)
def test_bash_completes_commands_and_options(tmp_path: Path, source: str) -> None:
    assert _complete(tmp_path, source, "werk", "mod") == ["models"]
    assert "--quiet" in _complete(tmp_path, source, "werk", "serve", "--q")
    assert set(_complete(tmp_path, source, "werk", "completion", "")) >= {"bash", "zsh", "fish"}


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_every_shell_gets_a_script_naming_the_complete_variable(tmp_path: Path, shell: str) -> None:
    done = subprocess.run(
        [str(WERK), "completion", shell],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"_WERK_COMPLETE=complete_{shell}" in done.stdout


def test_an_unknown_shell_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(WERK), "completion", "tcsh"], env=_env(tmp_path), capture_output=True, text=True
    )
    assert done.returncode == 2 and "tcsh" in done.stderr
