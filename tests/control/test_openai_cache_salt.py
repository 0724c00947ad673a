"""Every ``/v1`` call carries a per-principal cache salt (``OpenAICall.cache_salt``): equal for
one principal, different between principals, and not computable without the namespace key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import werk
from werk import BackendDescriptor, ModelSpec, OpenAICall, OpenAIReply, Runtime, hookimpl
from werk.state.principals import NamespaceKey, cache_salt
from werk.testing.service import local_service

SPEC = ModelSpec(id="m", backend="salty", identity="sha256:" + "7" * 64)


async def _start(spec: ModelSpec) -> Runtime:
    return Runtime(backend=spec.backend, model=spec, generation="g_salt")


async def _stop(runtime: Runtime) -> None:
    runtime.alive = False


class Capture:
    def __init__(self) -> None:
        self.calls: list[OpenAICall] = []

    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        register(BackendDescriptor(name="salty", start=_start, stop=_stop))

    @hookimpl
    def werk_openai(self, runtime: Runtime, call: OpenAICall) -> OpenAIReply:
        self.calls.append(call)
        return OpenAIReply(body={"choices": []})


def test_the_salt_is_a_keyed_digest_of_the_principal() -> None:
    key, other_key = NamespaceKey.ephemeral(), NamespaceKey.ephemeral()
    a, b = "p_" + "a" * 64, "p_" + "b" * 64
    assert cache_salt(key, a) == cache_salt(key, a)
    assert cache_salt(key, a) != cache_salt(key, b)
    assert cache_salt(key, a) != cache_salt(other_key, a)
    assert len(cache_salt(key, a)) == 32 and int(cache_salt(key, a), 16) >= 0
    assert a[2:] not in cache_salt(key, a)


@pytest.mark.anyio
async def test_each_v1_call_carries_its_principals_salt(tmp_path: Path) -> None:
    capture = Capture()
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("salty", capture)])
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with local_service([SPEC], home=tmp_path, pm=pm) as service:
        for principal in ("p_" + "a" * 64, "p_" + "a" * 64, "p_" + "b" * 64):
            await service.openai_request(principal, "chat.completions", body)
    first, again, other = (call.cache_salt for call in capture.calls)
    assert first is not None and first == again != other
