"""``werk chat`` driven through a real pseudo-terminal: persistence, resume, Ctrl+C, Ctrl+D.

The ``testkv`` backend answers deterministically from *every* prompt token, so the answer to a
turn depends on the whole history sent with it: a resumed conversation that resends its archive
must get the same answer as one that never stopped, and a different one from a conversation
without that history.
"""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

from _chat_support import (
    WERK,
    PtyChat,
    cli_env,
    import_model,
    marker,
    ok,
    process_gone,
    werk,
)

PROMPT = ">>> "
TURNS = ("hello there", "tell me more", "and then?")


def archive(home: Path, name: str) -> dict[str, object]:
    path = home / "chat-sessions" / name / "messages.json"
    data: dict[str, object] = json.loads(path.read_text())
    return data


def contents(record: dict[str, object]) -> list[tuple[str, str]]:
    messages = record["messages"]
    assert isinstance(messages, list)
    return [(m["role"], m["content"]) for m in messages]


def test_persistent_chat_resumes_with_its_history(home: Path, plugin_site: Path) -> None:
    import_model(home, plugin_site, "kv", "testkv", "alpha beta gamma delta epsilon zeta eta\n")
    env = cli_env(home, plugin_site)

    # Process 1: two turns, then /exit.
    chat = PtyChat(["chat", "kv", "--persistence", "--session", "s1"], env)
    try:
        chat.expect(PROMPT, 1)
        chat.send(TURNS[0] + "\n")
        chat.expect(PROMPT, 2)
        chat.send(TURNS[1] + "\n")
        chat.expect(PROMPT, 3)
        chat.send("/exit\n")
        assert chat.wait() == 0, chat.text()
        first_transcript = chat.text()
    finally:
        chat.close()
    first = contents(archive(home, "s1"))
    assert [role for role, _ in first] == ["user", "assistant"] * 2
    assert [text for role, text in first if role == "user"] == list(TURNS[:2])
    for _, reply in first[1::2]:
        assert reply and reply in first_transcript  # streamed to the terminal

    session_dir = home / "chat-sessions" / "s1"
    assert stat.S_IMODE(session_dir.stat().st_mode) == 0o700
    for name in ("messages.json", "session.lock"):
        assert stat.S_IMODE((session_dir / name).stat().st_mode) == 0o600
    assert sorted(p.name for p in session_dir.iterdir()) == ["messages.json", "session.lock"]

    # Process 2: a new process resumes the session; one more turn; Ctrl+D leaves.
    chat = PtyChat(["chat", "kv", "--session", "s1", "-v"], env)
    try:
        chat.expect("resumed session s1: 4 message(s) of model kv")
        chat.expect("cache capability probe: skipped; reuse checked on actual requests")
        chat.expect(PROMPT, 1)
        chat.send(TURNS[2] + "\n")
        chat.expect(PROMPT, 2)
        chat.send("\x04")
        assert chat.wait() == 0, chat.text()
        resumed_transcript = chat.text()
    finally:
        chat.close()
    resumed = contents(archive(home, "s1"))
    assert resumed[:4] == first
    assert resumed[4] == ("user", TURNS[2])
    assert resumed[5][1] in resumed_transcript
    assert "restored" not in resumed_transcript  # resuming never claims native KV reuse

    # The same three turns in one uninterrupted process (stdin is a pipe here).
    ok(werk(home, plugin_site, "chat", "kv", "--session", "ref", stdin="\n".join(TURNS) + "\n"))
    assert contents(archive(home, "ref")) == resumed

    # Without the history the last question gets another answer.
    fresh = ok(werk(home, plugin_site, "run", "kv", TURNS[2]))
    assert fresh.stdout.strip() != resumed[5][1]


def test_ctrl_c_cancels_the_reply_not_the_session(home: Path, plugin_site: Path) -> None:
    model_file = import_model(home, plugin_site, "sm", "standin", "stand-in model\n")
    chat = PtyChat(["chat", "sm", "--session", "c1"], cli_env(home, plugin_site))
    try:
        chat.expect(PROMPT, 1)
        child = int(marker(model_file, ".pid").read_text())
        chat.send("please <<hang>>\n")
        chat.expect("partial")
        chat.send("\x03")  # Ctrl+C while the reply streams
        chat.expect("reply cancelled; the turn was not kept")
        chat.expect(PROMPT, 2)
        assert not process_gone(child)  # the runtime (and its child process) lives on
        assert not marker(model_file, ".stopped").exists()
        chat.send("one two three\n")
        chat.expect("standin: three two one")
        chat.expect(PROMPT, 3)
        chat.send("half a line\x03")  # Ctrl+C at the prompt discards the line only
        chat.expect(PROMPT, 4)
        chat.send("/reset\n")
        chat.expect("conversation reset")
        # Wait for readline's prompt: a ^D typed before readline reads is swallowed by the
        # terminal's mode switch (cooked -> readline's raw mode), not delivered as EOF.
        chat.expect(PROMPT, 5)
        chat.send("\x04")
        assert chat.wait() == 0, chat.text()
    finally:
        chat.close()
    assert marker(model_file, ".stopped").read_text().split()[0] == str(child)
    assert process_gone(child)
    record = archive(home, "c1")
    assert record["messages"] == []  # the cancelled turn was never kept, /reset saved


def test_chat_on_a_pipe_prints_no_prompts(home: Path, plugin_site: Path) -> None:
    import_model(home, plugin_site, "sm", "standin", "stand-in model\n")
    proc = subprocess.run(
        [str(WERK), "chat", "sm"],
        input="a b\n/help\nc d\n",
        capture_output=True,
        text=True,
        env=cli_env(home, plugin_site),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "standin: b a\nstandin: d c\n"
    assert "/exit or Ctrl+D quits" in proc.stderr
    assert not (home / "chat-sessions").exists()  # no --persistence: nothing written
