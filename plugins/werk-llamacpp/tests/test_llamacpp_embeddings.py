"""``/v1/models/{id}`` and ``/v1/embeddings`` through a real ``werk serve`` and llama-server,
with the official ``openai`` SDK.

The demo GGUF is imported twice: ``demo`` as it is, ``demo-embed`` with the model option
``embeddings=true`` (``werk models import … --option embeddings=true``), which starts its
llama-server with ``--embeddings --pooling mean``. ``werk serve`` without ``--model`` serves
both."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import openai
import pytest
from test_llamacpp_process_support import (
    WERK,
    create_demo,
    needs_llama_server,
    werk_env,
    werk_serve,
)

pytestmark = [pytest.mark.slow, needs_llama_server]


def test_models_retrieve_and_embeddings_through_the_openai_sdk(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    create_demo(home)
    model_file = home / "models" / "files" / "demo.gguf"
    imported = subprocess.run(
        [str(WERK), "models", "import", str(model_file), "--id", "demo-embed",
         "--option", "embeddings=true"],
        env=werk_env(home), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    with werk_serve(home, args=()) as served:
        client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="unused")
        model = client.models.retrieve("demo")
        assert (model.id, model.owned_by) == ("demo", "llamacpp")
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("nothing-here")
        answer = client.embeddings.create(model="demo-embed", input=["hello world", "clocks"])
        vectors = [item.embedding for item in sorted(answer.data, key=lambda d: d.index)]
        assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) > 0
        assert all(math.isfinite(x) for x in vectors[0]) and vectors[0] != vectors[1]
        assert answer.model == "demo-embed"
        one = client.embeddings.create(model="demo-embed", input="hello world").data[0]
        again = client.embeddings.create(model="demo-embed", input="hello world").data[0]
        assert one.embedding == pytest.approx(again.embedding, rel=1e-4, abs=1e-5)
        with pytest.raises(openai.APIStatusError) as refused:
            client.embeddings.create(model="demo", input="hello")  # not started for it
        assert refused.value.status_code == 501
