"""Long waits show a transient spinner on a terminal and nothing in a pipe.

The ``standin`` backend's model file asks for a slow start (``start-delay: 1.5``), standing for a
model load that takes a while.
"""

from __future__ import annotations

from pathlib import Path

from _chat_support import PtyChat, cli_env, import_model, ok, werk

SLOW_MODEL = "stand-in model\nstart-delay: 1.5\n"


def test_run_on_a_terminal_shows_and_clears_a_loading_spinner(
    home: Path, plugin_site: Path
) -> None:
    import_model(home, plugin_site, "sm", "standin", SLOW_MODEL)
    run = PtyChat(["run", "sm", "one two three"], cli_env(home, plugin_site))
    assert run.wait() == 0, run.text()
    transcript = run.text()
    assert "loading sm (standin)" in transcript
    assert "standin: three two one" in transcript


def test_run_in_a_pipe_writes_no_spinner(home: Path, plugin_site: Path) -> None:
    import_model(home, plugin_site, "sm", "standin", SLOW_MODEL)
    done = ok(werk(home, plugin_site, "run", "sm", "one two three"))
    assert done.stdout == "standin: three two one\n"
    assert "loading" not in done.stderr and "waiting" not in done.stderr
    assert "\x1b" not in done.stdout + done.stderr
