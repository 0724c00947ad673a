"""``werk.http.comfy.ComfyApi`` without a server: a prompt whose execution fails unexpectedly
ends as ``error`` in the history (a generic message, never stuck in the queue), and the next
prompt of the key still runs."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from test_comfy_graph import GRAPH

from werk.backends import OpenAIReply
from werk.control.interface import ImageModel
from werk.http.comfy import ComfyApi


class _Control:
    """The two control calls a prompt makes; the first image request fails like a bug."""

    def __init__(self) -> None:
        self.calls = 0

    async def image_models(self) -> list[ImageModel]:
        return [ImageModel(id="m", identity="sha256:" + "0" * 64, directory="/x")]

    async def speech_models(self) -> list[str]:
        return []

    async def openai_request(self, principal: str, route: str, body: dict[str, Any]) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise KeyError("boom")
        return OpenAIReply(body={"data": [{"url": f"/v1/outputs/out_{self.calls}"}]})


def test_a_failed_prompt_is_an_error_in_the_history_and_the_next_one_runs() -> None:
    control = _Control()
    api = ComfyApi(control)  # type: ignore[arg-type]

    async def main() -> None:
        first, key = await api.submit("local", {"prompt": GRAPH})
        await api.run("local", key, first)
        second, _ = await api.submit("local", {"prompt": GRAPH})
        await api.run("local", key, second)

    anyio.run(main)
    history = api.history("local", None, None)
    statuses = [entry["status"]["status_str"] for entry in history.values()]
    assert statuses == ["error", "success"]
    failed = next(iter(history.values()))
    (kind, data) = failed["status"]["messages"][-1]
    assert kind == "execution_error" and data["exception_type"] == "internal"
    assert "boom" not in data["exception_message"]
    assert api.queue("local") == {"queue_running": [], "queue_pending": []}
    done = list(history.values())[1]["outputs"]["9"]["images"]
    assert [image["filename"] for image in done] == ["out_2.png", "out_3.png", "out_4.png"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
