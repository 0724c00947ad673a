"""Durable media jobs in ``werk cache``: finished jobs (with their outputs) are listed as
``job:<id>`` and purged through the job store; an unfinished job is active and never removed;
``--older-than`` counts from the record's last update."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from werk.protocol import JobError, JobStatus
from werk.state.jobs import JobStore

WERK = str(Path(sys.executable).parent / "werk")


def cache(home: Path, *args: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update(WERK_HOME=str(home), NO_COLOR="1")
    done = subprocess.run(
        [WERK, "cache", *args, "--json"], capture_output=True, text=True, env=env, timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def jobs(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    home = tmp_path / "home"
    week_ago = time.time() - 7 * 86400
    old = JobStore(home, clock=lambda: week_ago)
    done = old.create("p_a", "audio.speech", {"model": "tts", "input": "hi"})
    output = old.save_output(done.id, b"RIFF" + b"\0" * 60, "audio/wav")
    done = old.update(done.id, status=JobStatus.COMPLETED, output=output)
    store = JobStore(home, clock=time.time)
    failed = store.create("p_b", "images.generations", {"model": "img", "prompt": "x"})
    failed = store.update(
        failed.id, status=JobStatus.FAILED, error=JobError(code="backend_error", message="no")
    )
    running = store.create("p_a", "audio.speech", {"model": "tts", "input": "long"})
    running = store.update(running.id, status=JobStatus.RUNNING)
    return home, {"done": done, "failed": failed, "running": running, "output": output}


def test_jobs_are_listed_with_their_outputs_and_the_unfinished_one_is_active(
    jobs: tuple[Path, dict[str, Any]],
) -> None:
    home, made = jobs
    entries = {e["id"]: e for e in cache(home, "list", "--kind", "job")["entries"]}
    assert set(entries) == {f"job:{made[k].id}" for k in ("done", "failed", "running")}
    done = entries[f"job:{made['done'].id}"]
    record_size = (home / "jobs" / f"{made['done'].id}.json").stat().st_size
    assert done["bytes"] == record_size + 64  # the record and its output
    assert (done["kind"], done["model"], done["active"]) == ("job", "tts", False)
    assert done["description"] == "audio.speech job, completed, output audio/wav"
    assert entries[f"job:{made['running'].id}"]["active"] is True
    everything = {e["id"] for e in cache(home, "list")["entries"]}
    assert set(entries) <= everything


def test_purge_removes_finished_jobs_and_outputs_and_skips_the_unfinished_one(
    jobs: tuple[Path, dict[str, Any]],
) -> None:
    home, made = jobs
    output_file = home / "jobs" / "outputs" / made["output"].id
    assert output_file.is_file()
    preview = cache(home, "purge", "--all", "--kind", "job")
    assert preview["executed"] is False and output_file.is_file()
    old_only = cache(home, "purge", "--all", "--kind", "job", "--older-than", "3d", "--execute")
    assert old_only["removed"] == [f"job:{made['done'].id}"]
    assert not output_file.exists()
    assert not (home / "jobs" / f"{made['done'].id}.json").exists()
    rest = cache(home, "purge", "--all", "--kind", "job", "--execute")
    assert rest["removed"] == [f"job:{made['failed'].id}"]
    assert [(s["id"], s["reason"]) for s in rest["skipped"]] == [
        (f"job:{made['running'].id}", "active")
    ]
    store = JobStore(home, clock=time.time)
    assert [r.id for _, r in store.every_record()] == [made["running"].id]


def test_the_store_refuses_to_remove_an_unfinished_job(tmp_path: Path) -> None:
    store = JobStore(tmp_path, clock=time.time)
    queued = store.create("p", "audio.speech", {"model": "m", "input": "x"})
    assert store.remove(queued.id) == "unfinished"
    assert store.get("p", queued.id) == queued
    assert store.remove("job_missing") == "gone"
    store.update(queued.id, status=JobStatus.CANCELLED)
    assert store.remove(queued.id) == "removed"
    assert store.remove(queued.id) == "gone"
