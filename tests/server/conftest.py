"""Fixtures for end-to-end tests against a real ``werk serve`` process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _server import WerkServer, import_model, install_test_backend, werk_serve


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


KEY_A = "key-alpha-0123456789"
KEY_B = "key-bravo-9876543210"


@pytest.fixture
def auth_server(werk_home: Path, testkv_site: Path) -> Iterator[WerkServer]:
    """API-key mode with two keys (two principals), one testkv model ``kv``."""
    import_model(werk_home, testkv_site, "kv")
    with werk_serve(
        werk_home, testkv_site, ["--model", "kv", "--api-key", KEY_A, "--api-key", KEY_B]
    ) as server:
        server.api_keys = [KEY_A, KEY_B]
        yield server
