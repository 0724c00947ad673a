"""Every text backend of the Transformers, ONNX and MLX plugins behind one real ``werk serve``,
and the same tiny weights through three engines: Transformers
(``transformers``, its own forward pass), ONNX Runtime GenAI (``onnx-genai``, the model converted
by its builder) and MLX (``mlx``, ``mlx_lm.load`` of the same folder). Greedy decoding must give
identical token ids (vLLM's ``return_token_ids``), whole and streamed — the strongest evidence
that each backend really runs the model. Needs the three managed environments (``make test``
installs them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from werk.testing.server import WerkServer, werk_serve

pytestmark = pytest.mark.slow

WERK = Path(sys.executable).parent / "werk"
KEY = "parity-key-0123456789abcdef"
MODELS = {"transformers": "llama-torch", "onnx": "llama-onnx", "mlx": "llama-mlx"}
RUNNER, VLM = "llama-onnx-runner", "llava-mlx"


def _backends() -> str:
    backends = os.environ.get("WERK_BACKENDS_DIR", "")
    if not backends:
        pytest.fail("WERK_BACKENDS_DIR is not set: run the suite with `make test`")
    return backends


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WerkServer]:
    home = tmp_path_factory.mktemp("parity") / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env |= {"WERK_HOME": str(home), "WERK_BACKENDS_DIR": _backends()}
    for kind, model in MODELS.items():
        made = subprocess.run(
            [str(WERK), "models", "create-demo", "--kind", kind, "--id", model, "--seed", "3"],
            env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
    more = (
        ["models", "create-demo", "--kind", "mlx-vlm", "--id", VLM],
        ["models", "import", str(home / "models" / "files" / MODELS["onnx"]), "--id", RUNNER,
         "--backend", "onnx-runner"],
    )  # fmt: skip
    for command in more:
        done = subprocess.run(
            [str(WERK), *command], env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr
    models = [*MODELS.values(), RUNNER, VLM]
    args = [a for m in models for a in ("--model", m)] + ["--api-key", KEY]
    with werk_serve(home, None, args, env={"WERK_BACKENDS_DIR": _backends()}) as server:
        yield server


def _ids(server: WerkServer, model: str, route: str, **fields: Any) -> tuple[list[int], list[int]]:
    body: dict[str, Any] = {"model": model, "max_tokens": 16, "temperature": 0,
                            "return_token_ids": True} | fields  # fmt: skip
    if route == "chat":
        body["messages"] = [{"role": "user", "content": "Which state restores the prefix?"}]
    else:
        body["prompt"] = "The quick brown fox"
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    with server.client(KEY, timeout=300) as http:
        response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    if not body.get("stream"):
        answer = response.json()
        return answer["prompt_token_ids"], answer["choices"][0]["token_ids"]
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    chunks = [json.loads(line) for line in lines[:-1]]
    completion = [i for c in chunks for choice in c["choices"] for i in choice.get("token_ids", [])]
    prompt = next(c["prompt_token_ids"] for c in chunks if "prompt_token_ids" in c)
    return prompt, completion


@pytest.mark.parametrize("route", ["chat", "completion"])
@pytest.mark.parametrize("stream", [False, True])
def test_greedy_token_ids_are_the_same_in_all_three_engines(
    served: WerkServer, route: str, stream: bool
) -> None:
    answers = {kind: _ids(served, model, route, stream=stream) for kind, model in MODELS.items()}
    prompts = {kind: prompt for kind, (prompt, _) in answers.items()}
    completions = {kind: completion for kind, (_, completion) in answers.items()}
    assert completions["transformers"]  # (it may stop before 16 at the end-of-turn token)
    assert prompts["onnx"] == prompts["transformers"] == prompts["mlx"], prompts
    assert completions["onnx"] == completions["transformers"] == completions["mlx"], completions


RED = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AA"
    "AAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("model", "backend"),
    [
        (MODELS["transformers"], "transformers"),
        (MODELS["onnx"], "onnx-genai"),
        (RUNNER, "onnx-runner"),
        (MODELS["mlx"], "mlx"),
        (VLM, "mlx-vlm"),
    ],
)
def test_each_backend_answers_a_chat_in_the_same_server(
    served: WerkServer, model: str, backend: str, stream: bool
) -> None:
    content: Any = "Hello"
    if backend == "mlx-vlm":
        content = [
            {"type": "text", "text": "Hello"},
            {"type": "image_url", "image_url": {"url": RED}},
        ]
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": 6, "temperature": 0, "stream": stream}  # fmt: skip
    with served.client(KEY, timeout=300) as http:
        response = http.post("/v1/chat/completions", json=body)
        runtimes = http.get("/werk/v1/runtimes").json()["runtimes"]
    assert response.status_code == 200, response.text
    assert {r["model"]: r["backend"] for r in runtimes}[model] == backend
    if not stream:
        assert response.json()["choices"][0]["finish_reason"] in ("length", "stop")
        return
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    chunks = [json.loads(line) for line in lines[:-1]]
    assert lines[-1] == "[DONE]" and chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
