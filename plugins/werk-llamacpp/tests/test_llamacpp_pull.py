"""``werk models pull hf:…`` through the real ``huggingface_hub`` client against a loopback
stand-in for the Hugging Face Hub (no network here). The stand-in speaks the part of the hub API
the client uses for a pull: ``GET /api/models/{repo}/tree/{revision}`` (the file listing) and
``HEAD``/``GET /{repo}/resolve/{revision}/{file}`` (``X-Repo-Commit``, ``ETag``, ``Range``). The
repository holds two "quantisations": the generated MoE demo GGUF (~27 MB, more than the
client's 10 MiB write unit, so an interrupted download leaves bytes to resume from) and the tiny
one; the pulled one is served by a real llama-server."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gguf
import pytest
from test_llamacpp_process_support import (
    WERK,
    demo_model,
    needs_llama_server,
    split_demo_model,
    wait_until,
    werk_env,
    werk_serve,
)
from werk_llamacpp.demo import create_demo_model

pytestmark = pytest.mark.slow

REPO = "acme/Tiny-GGUF"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Hub:
    """The stand-in's state: the files, the Range headers seen, and a switch that makes a
    download stall halfway (until released) to interrupt a pull."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.ranges: list[tuple[str, str]] = []
        self.stall = threading.Event()
        self.release = threading.Event()
        self.stalled = threading.Event()


def handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, *, body: bool) -> None:
            path = self.path.split("?", 1)[0]
            tree = f"/api/models/{REPO}/tree/main"
            resolve = f"/{REPO}/resolve/main/"
            if path == tree:
                listing = [
                    {"type": "file", "path": name, "size": len(data), "oid": "0" * 40}
                    for name, data in hub.files.items()
                ]
                self._send(
                    200, json.dumps(listing).encode(), {"Content-Type": "application/json"}, body
                )
            elif path.startswith(resolve) and path[len(resolve) :] in hub.files:
                data = hub.files[path[len(resolve) :]]
                headers = {
                    "X-Repo-Commit": COMMIT,
                    "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                }
                wanted = self.headers.get("Range")
                if not body:
                    self._send(200, data, headers, body=False)
                    return
                if wanted:
                    hub.ranges.append((path[len(resolve) :], wanted))
                    start = int(wanted.removeprefix("bytes=").split("-")[0])
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                    self._send(206, data[start:], headers, body)
                elif hub.stall.is_set():
                    self.send_response(200)
                    for key, value in {**headers, "Content-Length": str(len(data))}.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    hub.stalled.set()
                    hub.release.wait(60)
                else:
                    self._send(200, data, headers, body)
            else:
                self._send(
                    404,
                    b'{"error": "Repository not found"}',
                    {"X-Error-Code": "RepoNotFound"},
                    body,
                )

        def _send(self, status: int, data: bytes, headers: dict[str, str], body: bool) -> None:
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(key, value)
            self.end_headers()
            if body:
                self.wfile.write(data)

    return Handler


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[Hub, str]]:
    moe = tmp_path / "moe.gguf"
    create_demo_model(moe, seed=0, size="moe")
    tiny = demo_model(tmp_path / "demo").read_bytes()
    split = {f"split/tiny-S-{p.name[5:]}": p.read_bytes() for p in split_demo_model(tmp_path / "s")}
    state = Hub(
        {"tiny-F16.gguf": moe.read_bytes(), "tiny-Q8_0.gguf": tiny, "README.md": b"# t", **split}
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()


def pull_env(tmp_path: Path, endpoint: str) -> dict[str, str]:
    return {
        "HF_ENDPOINT": endpoint,
        "HF_HUB_CACHE": str(tmp_path / "hf"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
    }


def blobs(tmp_path: Path) -> Path:
    """Where the Hugging Face cache keeps the repository's file contents, by ETag."""
    return tmp_path / "hf" / f"models--{REPO.replace('/', '--')}" / "blobs"


def werk(home: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(WERK), *args], env=werk_env(home, env), capture_output=True, text=True, timeout=120
    )


def test_a_quantisation_must_be_chosen_and_unknown_repositories_are_named(
    tmp_path: Path, hub: tuple[Hub, str]
) -> None:
    _, endpoint = hub
    env, home = pull_env(tmp_path, endpoint), tmp_path / "home"
    several = werk(home, env, "models", "pull", f"hf:{REPO}")
    assert several.returncode == 1
    assert "has several GGUF files" in several.stderr and "tiny-Q8_0.gguf" in several.stderr
    none = werk(home, env, "models", "pull", f"hf:{REPO}:Q4_K_M")
    assert none.returncode == 1 and "names no single file" in none.stderr
    bad = werk(home, env, "models", "pull", "TheBloke/Llama-2-7B-GGUF")
    assert bad.returncode == 1 and "give hf:OWNER/REPO" in bad.stderr
    missing = werk(home, env, "models", "pull", "hf:acme/absent")
    assert missing.returncode == 1 and "hf:acme/absent" in missing.stderr
    assert not (home / "models").exists() or not list((home / "models").glob("*.json"))


@needs_llama_server
def test_an_interrupted_pull_leaves_no_model_resumes_and_the_next_one_serves_a_chat(
    tmp_path: Path, hub: tuple[Hub, str]
) -> None:
    state, endpoint = hub
    env, home = pull_env(tmp_path, endpoint), tmp_path / "home"
    data = state.files["tiny-F16.gguf"]
    etag = hashlib.sha256(data).hexdigest()
    partial = blobs(tmp_path) / f"{etag}.werk-partial"
    state.stall.set()  # the download stalls halfway: the user presses Ctrl+C
    first = subprocess.Popen(
        [str(WERK), "models", "pull", f"hf:{REPO}:f16"],
        env=werk_env(home, env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert state.stalled.wait(60), "the download never started"
    # The client writes what it received in 10 MiB pieces: wait until the first is on disk.
    assert wait_until(lambda: partial.exists() and partial.stat().st_size > 0, 60)
    first.send_signal(signal.SIGINT)  # Ctrl+C
    first.communicate(timeout=30)
    assert first.returncode != 0
    state.stall.clear()
    state.release.set()
    assert not (home / "models").exists() or not list((home / "models").glob("*.json"))
    kept = partial.stat().st_size
    assert 0 < kept < len(data) and partial.read_bytes() == data[:kept]
    assert not (blobs(tmp_path) / etag).exists()  # no complete file, nothing in the snapshot
    assert not [p for p in (tmp_path / "hf").rglob("*.gguf")]

    # The client draws its bar on a terminal; TQDM_POSITION=-1 draws it into the pipe too.
    done = werk(home, {**env, "TQDM_POSITION": "-1"}, "models", "pull", f"hf:{REPO}:f16", "--json")
    assert done.returncode == 0, done.stderr
    assert state.ranges == [("tiny-F16.gguf", f"bytes={kept}-")]  # only the rest was asked for
    assert f"resuming tiny-F16.gguf at {kept} of {len(data)} bytes" in done.stderr
    # The client's progress bar: the file, a percentage, the bytes and the speed.
    assert "tiny-F16.gguf" in done.stderr and "100%" in done.stderr, done.stderr
    assert "27.6M/27.6M" in done.stderr and "B/s" in done.stderr, done.stderr
    assert "10.5M/27.6M" in done.stderr  # the bar starts where the last pull stopped
    manifest = json.loads(done.stdout)
    assert (manifest["id"], manifest["backend"]) == ("tiny-F16", "llamacpp")
    assert manifest["files"][0]["sha256"] == etag
    assert (blobs(tmp_path) / etag).read_bytes() == data
    assert not list((tmp_path / "hf").rglob("*.incomplete"))
    assert not list((tmp_path / "hf").rglob("*.werk-partial"))

    # Offline, the cached repository is pulled (imported) again without the hub.
    offline_env = {**env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    offline = werk(home, offline_env, "models", "pull", f"hf:{REPO}:f16", "--id", "again")
    assert offline.returncode == 0, offline.stderr
    assert "imported again (llamacpp)" in offline.stdout
    absent = werk(home, offline_env, "models", "pull", "hf:acme/other:f16")
    assert absent.returncode == 1 and "not in the Hugging Face cache" in absent.stderr

    with werk_serve(home, ("--model", "tiny-F16")) as served, served.client() as client:
        chat = {
            "model": "tiny-F16",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
        }
        answer = client.post("/v1/chat/completions", json=chat)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] > 0


def test_a_partial_download_that_does_not_match_the_hub_is_discarded(
    tmp_path: Path, hub: tuple[Hub, str]
) -> None:
    """Bytes left by an earlier pull that are not the file's (another tool wrote there, a disk
    fault): the completed file fails the hub's checksum, is deleted, and the pull after it
    downloads the whole file."""
    state, endpoint = hub
    env, home = pull_env(tmp_path, endpoint), tmp_path / "home"
    data = state.files["tiny-Q8_0.gguf"]
    etag = hashlib.sha256(data).hexdigest()
    partial = blobs(tmp_path) / f"{etag}.werk-partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"\0" * 1000)
    bad = werk(home, env, "models", "pull", f"hf:{REPO}:Q8_0")
    assert bad.returncode == 1 and "did not match the hub's checksum" in bad.stderr, bad.stderr
    assert state.ranges == [("tiny-Q8_0.gguf", "bytes=1000-")]
    assert not partial.exists() and not (blobs(tmp_path) / etag).exists()
    assert not (home / "models").exists() or not list((home / "models").glob("*.json"))
    good = werk(home, env, "models", "pull", f"hf:{REPO}:Q8_0", "--json")
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["files"][0]["sha256"] == etag
    assert len(state.ranges) == 1  # the whole file, no Range


def test_a_split_gguf_is_pulled_and_imported_with_every_part(
    tmp_path: Path, hub: tuple[Hub, str]
) -> None:
    state, endpoint = hub
    env, home = pull_env(tmp_path, endpoint), tmp_path / "home"
    done = werk(home, env, "models", "pull", f"hf:{REPO}:tiny-S", "--json")
    assert done.returncode == 0, done.stderr
    manifest = json.loads(done.stdout)
    assert manifest["id"] == "tiny-S"
    names = ["split/tiny-S-00001-of-00002.gguf", "split/tiny-S-00002-of-00002.gguf"]
    assert [f["sha256"] for f in manifest["files"]] == [
        hashlib.sha256(state.files[name]).hexdigest() for name in names
    ]
    shown = werk(home, env, "models", "show", "tiny-S", "--json")
    whole = gguf.GGUFReader(str(demo_model(tmp_path / "demo")))  # the file split in two
    parameters = sum(int(t.n_elements) for t in whole.tensors)
    assert json.loads(shown.stdout)["facts"]["parameters"] == parameters
