"""``werk models remove --delete-files``: only files Werk wrote (under WERK_HOME/models/files)
and no other model uses are deleted, after a preview; files imported in place never are."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from werk.models import ModelRegistry

WERK = Path(sys.executable).parent / "werk"


def werk(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"WERK_HOME": str(home), "PATH": "/usr/bin:/bin", "WERK_LOAD_PLUGINS": "testkv"}
    return subprocess.run([str(WERK), *args], env=env, capture_output=True, text=True, timeout=60)


def write(path: Path, data: bytes = b"weights") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_only_werks_own_unshared_files_are_deleted(tmp_path: Path) -> None:
    home = tmp_path / "home"
    registry = ModelRegistry(home)
    own = write(registry.files_root / "gen" / "model.bin")
    write(registry.files_root / "gen" / "werk-demo.json", b"{}")
    shared = write(registry.files_root / "shared.bin", b"shared")
    write(registry.files_root / "shared.bin.demo.json", b"{}")
    outside = write(tmp_path / "downloads" / "mine.bin")
    linked = registry.files_root / "link.bin"
    linked.symlink_to(outside)
    registry.import_files([own, shared, outside, linked], model_id="a", backend="b")
    registry.import_files([shared], model_id="other", backend="b")

    delete, keep = registry.owned_files(registry.get("a"))
    assert delete == [own]
    assert keep == [shared, outside, linked]

    preview = werk(home, "models", "remove", "a", "--delete-files", "--json")
    assert preview.returncode == 0, preview.stderr
    shown = json.loads(preview.stdout)
    assert (shown["executed"], shown["would_delete_files"]) == (False, [str(own)])
    assert own.exists() and (home / "models" / "a.json").exists()

    done = werk(home, "models", "remove", "a", "--delete-files", "--execute")
    assert done.returncode == 0, done.stderr
    assert "deleted 1 file(s)" in done.stdout and "kept 3 file(s) in place" in done.stdout
    assert not own.exists() and not (registry.files_root / "gen").exists()  # record and folder
    assert shared.exists() and outside.exists() and linked.is_symlink()
    assert [m.id for m in registry.manifests()] == ["other"]

    # The last model using the shared file owns it now.
    werk(home, "models", "remove", "other", "--delete-files", "--execute")
    assert not shared.exists() and not (registry.files_root / "shared.bin.demo.json").exists()
    assert registry.files_root.is_dir() and outside.exists()


def test_without_delete_files_nothing_is_deleted(tmp_path: Path) -> None:
    home = tmp_path / "home"
    registry = ModelRegistry(home)
    own = write(registry.files_root / "model.bin")
    registry.import_files([own], model_id="a", backend="b")
    done = werk(home, "models", "remove", "a", "--execute", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["deleted_files"] == []
    assert own.exists() and registry.manifests() == []
    missing = werk(home, "models", "remove", "a", "--delete-files")
    assert missing.returncode == 1 and "not imported" in missing.stderr
