"""Werk hook implementations for backends ``mlx`` (text generation with ``mlx-lm``) and
``mlx-vlm`` (text and image input with MLX-VLM), the seed's "MLX / MLX-VLM" row — the configured
command or Python module is invoked per request; no Werk resident model cache (the process
reloads the model); no cross-request prefix or KV reuse.

``mlx-vlm`` takes OpenAI ``image_url`` content parts with ``data:`` URLs (nothing is fetched);
its runner (``_vlm_runner.py``) runs in the mlx-vlm environment, with the Transformers version
MLX-VLM works with; ``WERK_MLX_VLM_CONCURRENCY`` bounds its runners.

Each request starts a runner (:class:`werk.RunnerModel`, the host's runner contract): the
model's ``runner`` option when given (any command that speaks the contract), else the bundled
``_runner.py`` (``mlx_lm.load`` and ``generate_step``) in the MLX python
(:mod:`.environment`). ``runner_timeout`` bounds a run (seconds, default 600);
``WERK_MLX_CONCURRENCY`` runners run at once (default 1; each loads its own copy of the model).

Rows: ``runtime.model_residency`` is ``unsupported`` (nothing stays loaded) when the runner can
start, ``unavailable`` when no MLX python is found and the model names no runner of its own;
the state, prefill/decode and expert rows are the host's ``unsupported``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path

from werk import (
    BackendDescriptor,
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    DemoModel,
    EnvironmentSpec,
    FoundPython,
    ModelSpec,
    OpenAICall,
    OpenAIReply,
    RunnerModel,
    Runtime,
    WerkError,
    generation_args,
    generation_reply,
    hookimpl,
)

from .environment import locate, locate_vlm

BACKEND, VLM = "mlx", "mlx-vlm"
RUNNERS = {BACKEND: "_runner.py", VLM: "_vlm_runner.py"}
LOCATORS: dict[str, Callable[[], FoundPython]] = {BACKEND: locate, VLM: locate_vlm}
CONCURRENCY = {BACKEND: "WERK_MLX_CONCURRENCY", VLM: "WERK_MLX_VLM_CONCURRENCY"}


def _bundled_runner(backend: str) -> Callable[[], list[str]]:
    script = Path(__file__).with_name(RUNNERS[backend])
    return lambda: [str(LOCATORS[backend]().python), str(script)]


async def start_runtime(spec: ModelSpec) -> Runtime:
    """Nothing runs until a request; the runner's command and options are checked here."""
    model = RunnerModel.of(
        spec,
        kind=spec.backend,
        default=_bundled_runner(spec.backend),
        concurrency_setting=CONCURRENCY[spec.backend],
    )
    return Runtime(
        backend=spec.backend, model=spec, generation="runner_" + secrets.token_hex(8), handle=model
    )


async def stop_runtime(runtime: Runtime) -> None:
    runtime.alive = False


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    register(
        BackendDescriptor(
            name=BACKEND,
            formats=("hf", "mlx"),
            description="MLX (mlx-lm) text generation, a process per request",
            start=start_runtime,
            stop=stop_runtime,
            routes=("chat.completions", "completions"),
        )
    )
    register(
        BackendDescriptor(
            name=VLM,
            formats=("hf", "mlx"),
            description="MLX-VLM text and image input, a process per request",
            start=start_runtime,
            stop=stop_runtime,
            routes=("chat.completions", "completions"),
        )
    )


@hookimpl
def werk_backend_environments() -> list[EnvironmentSpec]:
    """``werk backends install mlx``: MLX, mlx-lm (and torch for the demo); ``mlx-vlm``: MLX-VLM
    with its Transformers."""
    from .environment import environment_spec, vlm_environment_spec

    return [environment_spec(), vlm_environment_spec()]


@hookimpl
def werk_demo_models() -> list[DemoModel]:
    """``werk models create-demo --kind mlx|mlx-vlm``."""
    from .demos import DEMOS

    return list(DEMOS)


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    if context.backend not in RUNNERS:
        return []
    source = "the model's runner option"
    if context.model is None or "runner" not in context.model.options:
        try:
            source = f"its python from {LOCATORS[context.backend]().source}"
        except WerkError as exc:
            return [
                CapabilityReport(
                    id=CapabilityId.MODEL_RESIDENCY,
                    status=CapabilityStatus.UNAVAILABLE,
                    reason=exc.message,
                )
            ]
    return [
        CapabilityReport(
            id=CapabilityId.MODEL_RESIDENCY,
            status=CapabilityStatus.UNSUPPORTED,
            reason=f"each request starts an {context.backend} runner ({source}) that loads the "
            "model and exits after it; nothing stays loaded",
        )
    ]


@hookimpl
async def werk_openai(runtime: Runtime, call: OpenAICall) -> OpenAIReply | None:
    """Chat and text completions, each from a runner of its own."""
    handle = runtime.handle
    if not isinstance(handle, RunnerModel):
        return None
    args = generation_args(call, runtime.backend, images=runtime.backend == VLM)
    return await generation_reply(call, runtime.model.id, handle.run(args))
