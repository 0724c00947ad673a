"""Admission control for real: ``werk serve`` with two medium demo models under a real cgroup
memory limit that holds one of them but not both (issue 16).

* The first model serves and goes idle; the second model's request unloads it through relief
  (its llama-server process is gone) and succeeds.
* With the second model busy (a streamed request in flight), a request for the first fails with
  ``resource_exhausted`` naming the requirement and what is available, and the stream completes
  untouched (same process, all of its tokens).

The limit is a cgroup v2 ``memory.max`` or a cgroup v1 ``memory.limit_in_bytes``, whichever the
machine delegates (:mod:`werk.testing.cgroups`; the test prints which). The model files' pages
are dropped from the page cache first, so the children read them inside the limit.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_llamacpp_process_support import (
    WERK,
    create_demo,
    gone,
    llama_children,
    needs_llama_server,
    werk_env,
    werk_serve,
)

from werk.testing.cgroups import CgroupUnavailable, LimitedCgroup, memory_limited_cgroup

pytestmark = [pytest.mark.slow, needs_llama_server]

MiB = 1 << 20
LIMIT = 1536 * MiB
"""One medium demo runtime needs ~926 MiB: one fits below 85 % of 1.5 GiB, two do not."""


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        **extra,
    }


def drop_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture
def cgroup() -> Iterator[LimitedCgroup]:
    try:
        with memory_limited_cgroup(LIMIT) as limited:
            yield limited
    except CgroupUnavailable as exc:
        pytest.skip(f"no memory-limited cgroup here: {exc}")


def test_relief_unloads_an_idle_model_and_never_a_busy_one(
    tmp_path: Path, cgroup: LimitedCgroup
) -> None:
    home = tmp_path / "werk-home"
    for model, seed in (("a", "0"), ("b", "1")):
        create_demo(home, "--size", "medium", "--id", model, "--seed", seed)
    for gguf in (home / "models" / "files").glob("*.gguf"):
        drop_page_cache(gguf)

    def ps(url: str) -> dict[str, dict[str, Any]]:
        done = subprocess.run(
            [str(WERK), "ps", "--json", "--server", url],
            env=werk_env(home),
            capture_output=True,
            text=True,
            check=True,
        )
        return {r["model"]: r for r in json.loads(done.stdout)["runtimes"]}

    args = ("--model", "a", "--model", "b")
    with (
        werk_serve(home, args, preexec=cgroup.preexec()) as served,
        served.client(timeout=120) as client,
    ):
        memory = client.get("/werk/v1/memory").json()
        assert memory["host"]["total_bytes"] == LIMIT  # the server sees the cgroup's limit
        print(f"cgroup v{cgroup.version} {cgroup.path}: limit {LIMIT // MiB} MiB")

        # 1. The first model serves and goes idle.
        assert client.post("/v1/chat/completions", json=chat("a")).status_code == 200
        loaded = ps(served.base_url)
        assert list(loaded) == ["a"]
        first_pid = loaded["a"]["pid"]
        requirement = loaded["a"]["reserved_bytes"]
        assert 900 * MiB < requirement < 1000 * MiB, requirement
        assert client.get("/werk/v1/memory").json()["managed"]["allocated_bytes"] == requirement

        # 2. The second model's request unloads it through relief and succeeds.
        response = client.post("/v1/chat/completions", json=chat("b"))
        assert response.status_code == 200, response.text
        loaded = ps(served.base_url)
        assert list(loaded) == ["b"]
        assert gone(first_pid)
        second_pid = loaded["b"]["pid"]
        assert [p.pid for p in llama_children(served.process.pid)] == [second_pid]
        managed = client.get("/werk/v1/memory").json()["managed"]
        assert managed == {"allocated_bytes": loaded["b"]["reserved_bytes"], "reserved_bytes": 0}

        # 3. With the second model busy, the first cannot be loaded; the stream is untouched.
        stream_body = chat(
            "b",
            max_tokens=200,
            stream=True,
            ignore_eos=True,  # llama-server's own field: exactly 200 tokens
            stream_options={"include_usage": True},
        )
        with client.stream("POST", "/v1/chat/completions", json=stream_body) as stream:
            assert stream.status_code == 200
            events = stream.iter_lines()
            first = next(line for line in events if line.startswith("data: "))
            assert json.loads(first[6:])["model"] == "b"
            denied = client.post("/v1/chat/completions", json=chat("a"))
            rest = [line for line in events if line.startswith("data: ")]
        assert denied.status_code == 429, denied.text
        error = denied.json()["error"]
        assert error["code"] == "resource_exhausted"
        message = error["message"]
        assert "cannot load: model 'a' needs " in message
        assert "weights " in message and "kv cache " in message and "compute " in message
        assert "available below the hard threshold" in message
        assert "skipped model b (in use)" in message
        print(f"denial: {message}")
        assert rest[-1] == "data: [DONE]"
        chunks = [json.loads(line[6:]) for line in rest[:-1]]
        finished = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        assert finished[-1] == "length"
        assert chunks[-1]["usage"]["completion_tokens"] == 200  # every token arrived
        assert list(ps(served.base_url)) == ["b"]
        assert ps(served.base_url)["b"]["pid"] == second_pid
        assert [p.pid for p in llama_children(served.process.pid)] == [second_pid]
        print(f"cgroup peak usage: {cgroup.peak_bytes() // MiB} MiB of {LIMIT // MiB} MiB")
        assert cgroup.oom_kills() == 0  # reclaim of clean page cache only, nothing killed
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{served.base_url}/werk/v1/health", timeout=1)
