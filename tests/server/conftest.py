"""Fixtures for end-to-end tests against a real ``werk serve`` process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from _server import (
    KEY_A,
    KEY_B,
    ErrorBodyCheck,
    SpawnServer,
    WerkServer,
    import_model,
    install_test_backend,
    werk_serve,
)


@pytest.fixture(scope="session")
def testkv_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_test_backend(tmp_path_factory.mktemp("testkv"))


@pytest.fixture
def werk_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    return home


@pytest.fixture
def local_server(werk_home: Path, testkv_site: Path) -> Iterator[WerkServer]:
    """Unauthenticated local mode, one testkv model ``kv``."""
    import_model(werk_home, testkv_site, "kv")
    with werk_serve(werk_home, testkv_site, ["--model", "kv"]) as server:
        yield server


@pytest.fixture
def auth_server(werk_home: Path, testkv_site: Path) -> Iterator[WerkServer]:
    """API-key mode with two keys (two principals), one testkv model ``kv``."""
    import_model(werk_home, testkv_site, "kv")
    with werk_serve(
        werk_home, testkv_site, ["--model", "kv", "--api-key", KEY_A, "--api-key", KEY_B]
    ) as server:
        server.api_keys = [KEY_A, KEY_B]
        yield server


# -- module-scoped servers (appended for test_routes / isolation / policy / openai / client) ----


@pytest.fixture(scope="module")
def spawn_server(
    tmp_path_factory: pytest.TempPathFactory, testkv_site: Path
) -> Iterator[SpawnServer]:
    """A factory for real ``werk serve`` processes that live until the test module ends.

    ``spawn_server(models={"kv": "alpha beta"}, args=[...], keys=[...])`` gives every call its
    own ``WERK_HOME`` (``server.home``), imports each model from ``<home>/../<id>.testkv`` (the
    text becomes the model file, so ``"<<fail-start>>"`` makes a model that cannot start),
    passes ``--model`` for each and ``--api-key`` for each key, and waits for readiness.
    Servers are stopped (SIGTERM) when the module's tests are done.
    """
    with contextlib.ExitStack() as stack:

        def spawn(
            *,
            models: Mapping[str, str] | None = None,
            args: Sequence[str] = (),
            keys: Sequence[str] = (),
        ) -> WerkServer:
            home = tmp_path_factory.mktemp("serve") / "home"
            home.mkdir()
            chosen = {"kv": "alpha beta gamma delta"} if models is None else models
            argv: list[str] = []
            for model_id, text in chosen.items():
                import_model(home, testkv_site, model_id, text)
                argv += ["--model", model_id]
            for key in keys:
                argv += ["--api-key", key]
            server = stack.enter_context(werk_serve(home, testkv_site, [*argv, *args]))
            server.api_keys = list(keys)
            return server

        yield spawn


# -- error-body checks (appended for test_hardening / test_hardening_bodies) ---------------------


@pytest.fixture
def error_body(testkv_site: Path) -> Iterator[ErrorBodyCheck]:
    """An :class:`ErrorBodyCheck`; a test that asks for it must check at least one answer."""
    check = ErrorBodyCheck(testkv_site)
    yield check
    assert check.bodies, "no error body was checked"
