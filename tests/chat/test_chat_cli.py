"""``werk run`` options, prompts from stdin, sessions and exit codes (real console script)."""

from __future__ import annotations

import json
from pathlib import Path

from _chat_support import import_model, ok, werk

from werk.chat.archive import SessionStore


def test_prompt_sources_json_and_system(home: Path, plugin_site: Path) -> None:
    import_model(home, plugin_site, "sm", "standin", "stand-in\n")
    import_model(home, plugin_site, "kv", "testkv", "alpha beta gamma\n")
    assert ok(werk(home, plugin_site, "run", "sm", stdin="from stdin")).stdout == (
        "standin: stdin from\n"
    )
    assert ok(werk(home, plugin_site, "run", "sm", "-", stdin="dash")).stdout == "standin: dash\n"
    response = json.loads(ok(werk(home, plugin_site, "run", "sm", "--json", "x y")).stdout)
    assert response["object"] == "chat.completion"
    assert response["choices"][0]["message"] == {"role": "assistant", "content": "standin: y x"}
    assert response["choices"][0]["finish_reason"] == "stop"
    plain = ok(werk(home, plugin_site, "run", "kv", "hi")).stdout
    ok(werk(home, plugin_site, "run", "kv", "--session", "sys", "--system", "be brief", "hi"))
    record = SessionStore(home).read("sys")
    assert record.system == "be brief"
    assert record.messages[1].content != plain.strip()  # the system prompt was sent


def test_usage_errors_exit_2(home: Path, plugin_site: Path) -> None:
    import_model(home, plugin_site, "sm", "standin", "stand-in\n")
    for args, stdin in (
        (("run", "sm"), "   \n"),
        (("run", "sm", "--session", "../escape", "hi"), ""),
        (("run", "sm", "--temperature", "9", "hi"), ""),
        (("run", "sm", "--max-tokens", "0", "hi"), ""),
        (("run", "sm", "--server", "https://example.org", "hi"), ""),
        (("chat", "sm", "--session", "a/b"), ""),
    ):
        proc = werk(home, plugin_site, *args, stdin=stdin)
        assert proc.returncode == 2, (args, proc.stderr)
    assert not (home / "chat-sessions").exists()


def test_sessions_are_exclusive_and_bound_to_their_model(home: Path, plugin_site: Path) -> None:
    import_model(home, plugin_site, "sm", "standin", "stand-in\n")
    import_model(home, plugin_site, "kv", "testkv", "alpha beta gamma\n")
    ok(werk(home, plugin_site, "run", "sm", "--session", "s", "one"))
    other_model = werk(home, plugin_site, "run", "kv", "--session", "s", "two", "--json")
    assert other_model.returncode == 1
    assert json.loads(other_model.stdout)["error"]["code"] == "conflict"
    with SessionStore(home).open("s", model="sm"):  # a live holder (this test process)
        busy = werk(home, plugin_site, "run", "sm", "--session", "s", "three")
        assert busy.returncode == 1 and "in use by another live werk process" in busy.stderr
    unknown = werk(home, plugin_site, "run", "nope", "hi")
    assert unknown.returncode == 1 and "not imported" in unknown.stderr
    assert [m.content for m in SessionStore(home).read("s").messages] == ["one", "standin: one"]
