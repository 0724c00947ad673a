"""The service's job runner with an in-process speech stand-in (the real worker is exercised in
``plugins/werk-media/tests/test_media_jobs.py``): queue order, outputs, failures as records,
cancellation of a running job, and no queue without a runner."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

import werk
from werk import BackendDescriptor, ModelSpec, OpenAICall, OpenAIReply, Runtime, hookimpl
from werk.control.service import LocalControlService, ServiceConfig
from werk.models import ModelRegistry
from werk.protocol import AuthMode, JobRecord, JobStatus
from werk.state.principals import NamespaceKey

BODY = {"model": "voice", "input": "hi", "voice": None, "response_format": "wav", "speed": 1.0}


class SpeechStandIn:
    """Answers speech with the input's bytes; fails on "boom"; waits on a gate when asked."""

    def __init__(self) -> None:
        self.gate: anyio.Event | None = None
        self.started = 0

    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        async def start(model: ModelSpec) -> Runtime:
            return Runtime(backend="say", model=model, generation="g_" + secrets.token_hex(4))

        async def stop(runtime: Runtime) -> None:
            runtime.alive = False

        register(
            BackendDescriptor(
                name="say", formats=("say",), start=start, stop=stop, routes=("audio.speech",)
            )
        )

    @hookimpl
    async def werk_openai(self, runtime: Runtime, call: OpenAICall) -> OpenAIReply:
        self.started += 1
        if self.gate is not None:
            await self.gate.wait()
        if call.body["input"] == "boom":
            raise werk.BackendError("the voice broke")
        return OpenAIReply(content=str(call.body["input"]).encode(), media_type="audio/wav")


@pytest.fixture
def service(tmp_path: Path) -> tuple[LocalControlService, SpeechStandIn]:
    plugin = SpeechStandIn()
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("say", plugin)])
    weights = tmp_path / "v.say"
    weights.write_bytes(b"say")
    manifest = ModelRegistry(tmp_path).import_files([weights], model_id="voice", backend="say")
    config = ServiceConfig(
        home=tmp_path,
        models=[manifest],
        auth_mode=AuthMode.UNAUTHENTICATED_LOCAL,
        namespace_key=NamespaceKey.ephemeral(),
    )
    return LocalControlService(pm, config), plugin


async def _until(control: LocalControlService, job_id: str, *statuses: JobStatus) -> JobStatus:
    with anyio.fail_after(10):
        while (record := await control.job("local", job_id)).status not in statuses:
            await anyio.sleep(0.01)
    return record.status


@pytest.mark.anyio
async def test_jobs_run_in_order_and_keep_outputs_and_errors(
    service: tuple[LocalControlService, SpeechStandIn],
) -> None:
    control, _ = service
    with pytest.raises(werk.Unavailable, match="runs no job queue"):
        await control.submit_job("local", "audio.speech", BODY)  # no runner: nothing stored
    assert await control.jobs("local") == []
    seen: list[tuple[str, object]] = []
    update = control.job_store.update

    def recording_update(job_id: str, **changes: object) -> JobRecord:
        seen.append((job_id, changes.get("status")))
        return update(job_id, **changes)  # type: ignore[arg-type]

    control.job_store.update = recording_update  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        await tg.start(control.run_jobs)
        good = await control.submit_job("local", "audio.speech", BODY)
        bad = await control.submit_job("local", "audio.speech", {**BODY, "input": "boom"})
        assert await _until(control, bad.id, JobStatus.FAILED) is JobStatus.FAILED
        done = await control.job("local", good.id)
        assert done.status is JobStatus.COMPLETED and done.output is not None
        assert await control.job_output("local", done.output.id) == (b"hi", "audio/wav")
        failed = await control.job("local", bad.id)
        assert failed.error is not None
        assert (failed.error.code, failed.error.message) == ("backend_error", "the voice broke")
        with pytest.raises(werk.NotFound):
            await control.job("someone-else", good.id)
        tg.cancel_scope.cancel()
    phases = [JobStatus.LOADING, JobStatus.RUNNING, JobStatus.ENCODING, JobStatus.COMPLETED]
    assert [status for job_id, status in seen if job_id == good.id] == phases
    assert [status for job_id, status in seen if job_id == bad.id] == [
        JobStatus.LOADING, JobStatus.RUNNING, JobStatus.FAILED
    ]  # fmt: skip


@pytest.mark.anyio
async def test_a_running_job_cancelled_ends_cancelled_without_an_output(
    service: tuple[LocalControlService, SpeechStandIn],
) -> None:
    control, plugin = service
    plugin.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        await tg.start(control.run_jobs)
        job = await control.submit_job("local", "audio.speech", BODY)
        await _until(control, job.id, JobStatus.RUNNING)
        requested = await control.cancel_job("local", job.id)
        assert requested.status is JobStatus.RUNNING and requested.cancel_requested
        plugin.gate.set()
        assert await _until(control, job.id, JobStatus.CANCELLED) is JobStatus.CANCELLED
        assert (await control.job("local", job.id)).output is None
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_only_job_routes_the_model_serves_are_accepted(
    service: tuple[LocalControlService, SpeechStandIn],
) -> None:
    control, _ = service
    async with anyio.create_task_group() as tg:
        await tg.start(control.run_jobs)
        image = {"model": "voice", "prompt": "x", "n": 1}
        with pytest.raises(werk.Unsupported, match="does not serve /v1/images/generations"):
            await control.submit_job("local", "images.generations", image)
        with pytest.raises(werk.InvalidRequest, match="cannot run as a job"):
            await control.submit_job("local", "chat.completions", {"model": "voice"})
        tg.cancel_scope.cancel()
