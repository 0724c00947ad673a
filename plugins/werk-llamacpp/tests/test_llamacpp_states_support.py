"""Helpers (no tests) for the llama.cpp state tests: a real llama-server child and its handle.

The child is the real ``llama-server`` (located like the plugin does) serving a tiny generated
demo GGUF, started the way the process layer starts one: loopback, random port and API key,
a private ``0700`` slot directory, ``--cache-ram 0`` and ``--no-warmup`` (each overridable to
build children that must fail the probe). :func:`make_handle` wraps it in the plugin's own
:class:`~werk_llamacpp.handle.LlamaHandle`, exactly what ``states``/``probe`` receive in
production. Tests using these are ``slow`` and skip only when no llama-server exists.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from werk_llamacpp.demo import create_demo_model
from werk_llamacpp.executable import locate_llama_server
from werk_llamacpp.handle import LlamaHandle

from werk import BackendState, LoopbackClient, ModelSpec, Runtime

LLAMA_SERVER = locate_llama_server().path

needs_llama_server = pytest.mark.skipif(
    LLAMA_SERVER is None, reason="no llama-server executable on this machine"
)

HELP_CACHE: dict[Path, str] = {}


def help_text(executable: Path) -> str:
    if executable not in HELP_CACHE:
        done = subprocess.run(
            [str(executable), "--help"], capture_output=True, text=True, timeout=60, check=False
        )
        HELP_CACHE[executable] = done.stdout + done.stderr
    return HELP_CACHE[executable]


_LAUNCH = re.compile(r"launch_slot_: id\s+\d+ \| task (\d+) \|")
_TIMING = re.compile(
    r"print_timing: id\s+(\d+) \| task (\d+) \| prompt eval time =\s+[\d.]+ ms /\s+(\d+) "
)


def prompt_evals(
    log_path: Path, slot: int, timeout: float = 30, finished: Iterable[int] = ()
) -> list[int]:
    """Prompt tokens llama-server computed for each finished task in ``slot``, in task order, from
    its own log (``print_timing: id  S | task T | prompt eval time = … / N tokens``): ``N`` is
    the task's ``prompt_n``, so a prefix reused from the slot shows as ``1``.

    The server's logger writes from its own thread, a little after the HTTP answer; the log is
    read once every launched task, and every task id in ``finished`` (known finished from the
    server itself, e.g. ``/slots``: a task whose lines were not written yet at all is not
    "launched" in the log either), has its timing line (bounded wait, then a loud failure).
    """
    deadline = time.monotonic() + timeout
    required = set(finished)
    while True:
        text = log_path.read_text(errors="replace")
        launched = {int(t) for t in _LAUNCH.findall(text)}
        timed = {int(t): (int(s), int(n)) for s, t, n in _TIMING.findall(text)}
        if (launched | required) <= timed.keys():
            return [n for t, (s, n) in sorted(timed.items()) if s == slot]
        if time.monotonic() > deadline:
            missing = (launched | required) - timed.keys()
            raise AssertionError(f"llama-server's log never showed tasks {missing}")
        time.sleep(0.01)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def demo_model(directory: Path, size: str = "tiny") -> Path:
    path = directory / f"demo-{size}.gguf"
    if not path.exists():
        create_demo_model(path, seed=0, size=size)  # type: ignore[arg-type]
    return path


@dataclass
class Child:
    """A running llama-server and everything needed to build a handle for it."""

    process: subprocess.Popen[bytes]
    base_url: str
    api_key: str
    slot_dir: Path
    log_path: Path
    args: tuple[str, ...]
    help_text: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def direct(self) -> httpx.Client:
        """A client that talks to the child behind Werk's back (for controls)."""
        return httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=120,
        )

    def prompt_evals(self, slot: int) -> list[int]:
        """:func:`prompt_evals` once the log shows every slot's last task as ``/slots`` reports
        it (the log can lag a whole task behind the HTTP answers)."""
        with self.direct() as client:
            slots = client.get("/slots").json()
        last = [s["id_task"] for s in slots if isinstance(s.get("id_task"), int)]
        return prompt_evals(self.log_path, slot, finished=last)


@contextlib.contextmanager
def llama_child(
    workdir: Path,
    model: Path,
    *,
    slots: int = 2,
    ctx_per_slot: int = 1024,
    cache_ram_zero: bool = True,
    slot_save_path: bool = True,
    extra: Sequence[str] = (),
) -> Iterator[Child]:
    """Start llama-server like the process layer does and wait for ``/health``."""
    assert LLAMA_SERVER is not None
    port, key = free_port(), secrets.token_hex(16)
    slot_dir = workdir / f"slots-{port}"
    slot_dir.mkdir(mode=0o700)
    args = [
        "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "--api-key", key,
        "-np", str(slots), "-c", str(slots * ctx_per_slot), "--no-warmup",
    ]  # fmt: skip
    if slot_save_path:
        args += ["--slot-save-path", str(slot_dir)]
    if cache_ram_zero:
        args += ["--cache-ram", "0"]
    args += list(extra)
    log_path = workdir / f"llama-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([str(LLAMA_SERVER), *args], stdout=log, stderr=subprocess.STDOUT)
    child = Child(
        process, f"http://127.0.0.1:{port}", key, slot_dir, log_path, tuple(args),
        help_text(LLAMA_SERVER),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"llama-server exited {process.returncode}:\n{child.log()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{child.base_url}/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not become ready:\n{child.log()}")
            time.sleep(0.05)
        yield child
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def loopback_to(base_url: str, api_key: str | None = None) -> LoopbackClient:
    """The host's loopback client to ``base_url``, as the process layer makes one per child
    (``LlamaHandle.http``)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return LoopbackClient("127.0.0.1", int(base_url.rsplit(":", 1)[1]), headers=headers)


def make_handle(
    child: Child,
    *,
    state_slots: tuple[int, ...] = (1,),
    generation: str | None = None,
    args: Sequence[str] | None = None,
    total_slots: int | None = None,
) -> LlamaHandle:
    """A fresh :class:`LlamaHandle` (probe not run, new allocator) for ``child``."""
    with child.direct() as direct:
        props: dict[str, Any] = direct.get("/props").json()
    http = loopback_to(child.base_url, child.api_key)
    return LlamaHandle(
        base_url=child.base_url,
        api_key=child.api_key,
        http=http,
        pid=child.process.pid,
        generation=generation or f"g_{secrets.token_hex(8)}",
        slot_dir=child.slot_dir,
        total_slots=total_slots if total_slots is not None else int(props["total_slots"]),
        state_slots=state_slots,
        help_text=child.help_text,
        args=tuple(args) if args is not None else child.args,
        log_path=child.log_path,
    )


def runtime_for(handle: LlamaHandle) -> Runtime:
    return Runtime(
        backend="llamacpp",
        model=ModelSpec(id="demo", backend="llamacpp", identity="sha256:" + "0" * 64),
        generation=handle.generation,
        handle=handle,
        args=handle.args,
    )


def uncached_completion(child: Child, slot: int, prompt: Any, n_predict: int) -> dict[str, Any]:
    """The control: the same greedy request in another, erased slot without prompt caching."""
    with child.direct() as direct:
        direct.post(f"/slots/{slot}?action=erase").raise_for_status()
        answer = direct.post(
            "/completion",
            json={
                "prompt": prompt,
                "n_predict": n_predict,
                "temperature": 0.0,
                "cache_prompt": False,
                "id_slot": slot,
            },
        )
        answer.raise_for_status()
        data: dict[str, Any] = answer.json()
    return data


def slot_files(child: Child) -> list[str]:
    """The slot directory's files, but the spills of held states (see :func:`spill_files`)."""
    return sorted(f for f in os.listdir(child.slot_dir) if not f.startswith("werk-spill-"))


def spill_files(child: Child) -> list[str]:
    return sorted(f for f in os.listdir(child.slot_dir) if f.startswith("werk-spill-"))


def payload_copy(state: BackendState, scratch: Path) -> BackendState:
    """What the host does with a snapshot: keep its bytes, hand a scratch copy to restore."""
    assert state.path is not None
    scratch.write_bytes(state.path.read_bytes())
    state.path.unlink()
    return BackendState(kind=state.kind, path=scratch, generation=state.generation)
