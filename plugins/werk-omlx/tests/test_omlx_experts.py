"""The oMLX expert adapter (``werk_omlx.experts``) on a real tiny DeepSeek-V3 mixture of experts
that ``mlx_lm`` wrote (4-bit affine, two shards; ``omlx_standin/tiny_mlx_model.py moe``).

The adapter alone: supported only for that layout with a budget; sizes from the file headers;
the LRU bound respected; residency true to what is loaded; moves reported only when they
happened; a truncated or missing shard makes it unavailable without crashing. Through a real
``werk serve`` (the stand-in runs the same model with MLX): ``runtime.experts.residency`` is
``experimental`` only once a worker of the model runs, and prefetch/evict act on real slices.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omlx_testing import GENERATOR, KEY, werk
from werk_omlx.experts import BUDGET_ENV, Unsupported, adapter_for

from werk.testing.server import werk_serve

pytestmark = pytest.mark.slow

EXPERT_BYTES = 4608  # 3 projections x (uint32 weight + float32 scales and biases) at this size


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("moe") / "tiny-moe"
    subprocess.run(
        [sys.executable, str(GENERATOR), str(target), "0", "moe"], check=True, timeout=300
    )
    return target


def test_only_a_deepseek_affine_checkpoint_with_a_budget_gets_the_adapter(
    moe_model: Path, mlx_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(BUDGET_ENV, raising=False)
    with pytest.raises(Unsupported, match="not set to a positive number"):
        adapter_for(moe_model)
    monkeypatch.setenv(BUDGET_ENV, "1")
    with pytest.raises(Unsupported, match="not a DeepSeek MoE"):
        adapter_for(mlx_model)
    adapter = adapter_for(moe_model)
    assert adapter.active and adapter.layers == [0, 1] and adapter.experts_per_layer == 4
    observed = adapter.observe()
    assert [e for e, _, _ in observed] == [f"L{layer}.E{i}" for layer in (0, 1) for i in range(4)]
    assert {(tier, size) for _, tier, size in observed} == {("external", EXPERT_BYTES)}


def test_the_cache_keeps_within_its_bound_and_reports_only_real_moves(
    moe_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BUDGET_ENV, str(2 * EXPERT_BYTES / 2**20))  # room for two experts
    adapter = adapter_for(moe_model)
    assert adapter.move(["L0.E0", "L1.E3"], "ram") == (["L0.E0", "L1.E3"], [])
    assert adapter.cached_bytes() == 2 * EXPERT_BYTES
    # A third evicts the least recently used; asking again for a resident one moves nothing.
    assert adapter.move(["L1.E3", "L0.E2"], "ram") == (["L0.E2"], [])
    tiers = {e: t for e, t, _ in adapter.observe()}
    assert sorted(e for e, t in tiers.items() if t == "ram") == ["L0.E2", "L1.E3"]
    assert adapter.cached_bytes() == 2 * EXPERT_BYTES
    # Three at once cannot all stay: the one evicted within the call is reported failed.
    moved, failed = adapter.move(["L0.E1", "L1.E1", "L1.E2"], "ram")
    assert (moved, failed) == (["L1.E1", "L1.E2"], ["L0.E1"])
    assert adapter.move(["L1.E1", "L0.E0"], "external") == (["L1.E1"], [])  # L0.E0: not cached
    assert adapter.move(["L1.E2"], "vram") == ([], ["L1.E2"])  # no VRAM on unified memory
    assert adapter.move(["L7.E0"], "ram") == ([], ["L7.E0"])  # no such expert


@pytest.mark.parametrize("damage", ["truncate", "remove"])
def test_a_broken_shard_makes_the_adapter_unavailable_without_crashing(
    moe_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    monkeypatch.setenv(BUDGET_ENV, "1")
    broken = tmp_path / "broken"
    shutil.copytree(moe_model, broken)
    shard = broken / "model-00002-of-00002.safetensors"
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:200])
    else:
        shard.unlink()
    adapter = adapter_for(broken)
    assert not adapter.active
    assert (adapter.problem or "").startswith("the expert self-check failed")


def test_the_row_follows_the_adapter_and_the_worker(
    moe_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, omlx_bin: Path
) -> None:
    """The cells without a server: adapter self-check failed → ``unavailable``; adapter
    ready but no worker running → ``unavailable``; no adapter → ``unsupported``."""
    from werk_omlx import plugin
    from werk_omlx.installation import Inspection, Installation
    from werk_omlx.worker import OmlxHandle

    import werk

    monkeypatch.setenv("WERK_OMLX_BIN", str(omlx_bin))
    monkeypatch.setenv(BUDGET_ENV, "1")
    spec = werk.ModelSpec(id="moe", backend="omlx", identity="sha256:" + "0" * 64)

    def row(adapter: object, reason: str = "") -> werk.CapabilityReport:
        handle = OmlxHandle(
            spec=spec, model_dir=moe_model, installation=Installation(omlx_bin, "test"),
            inspection=Inspection("0", frozenset()), cache_on=False,
            experts=adapter, experts_reason=reason,  # type: ignore[arg-type]
        )  # fmt: skip
        runtime = werk.Runtime(backend="omlx", model=spec, generation="g_0", handle=handle)
        context = werk.CapabilityContext(backend="omlx", model=spec, runtime=runtime)
        (found,) = [
            r for r in plugin.werk_capabilities(context) if r.id.value.endswith("experts.residency")
        ]
        return found

    ready = adapter_for(moe_model)
    assert row(ready).status.value == "unavailable"
    assert "no oMLX worker of the model is loaded" in (row(ready).reason or "")
    broken = adapter_for(moe_model)
    broken.problem = "the expert self-check failed: broken"
    assert (row(broken).status.value, row(broken).reason) == ("unavailable", broken.problem)
    absent = row(None, "model_type 'llama' is not a DeepSeek MoE")
    assert absent.status.value == "unsupported"
    assert absent.reason == "no expert adapter: model_type 'llama' is not a DeepSeek MoE"


def test_expert_residency_through_werk_serve_acts_on_real_slices(
    moe_model: Path, omlx_bin: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    imported = werk(home, "models", "import", str(moe_model), "--id", "moe", "--backend", "omlx")
    assert imported.returncode == 0, imported.stderr
    budget = str(2 * EXPERT_BYTES / 2**20)
    env = {"WERK_OMLX_BIN": str(omlx_bin), BUDGET_ENV: budget}
    # --no-preload: the first row is read before any runtime exists (a preload racing the
    # first query made it "unavailable" under load).
    args = ["--model", "moe", "--api-key", KEY, "--no-preload"]
    with werk_serve(home, None, args, env=env) as server, server.client(KEY, timeout=120) as http:

        def row() -> dict[str, str]:
            rows = http.get("/werk/v1/capabilities", params={"model": "moe"}).json()
            found: dict[str, str] = next(
                r for r in rows["capabilities"] if r["id"] == "runtime.experts.residency"
            )
            return found

        assert row()["status"] == "unsupported"  # no runtime yet: decided when it starts
        chat = {"model": "moe", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3, "temperature": 0}  # fmt: skip
        assert http.post("/v1/chat/completions", json=chat).status_code == 200
        assert row()["status"] == "experimental"
        listed = http.get("/werk/v1/experts", params={"model": "moe"}).json()["experts"]
        assert len(listed) == 8 and {e["tier"] for e in listed} == {"external"}
        assert {e["bytes"] for e in listed} == {EXPERT_BYTES}
        action = {"experts": ["L0.E0", "L0.E1", "L1.E2"], "target": "ram", "dry_run": False,
                  "allow_experimental": True}  # fmt: skip
        applied = http.post("/werk/v1/experts/moe/prefetch", json=action)
        assert applied.status_code == 200, applied.text
        # Room for two: L0.E0 was loaded, then evicted within the call, so only two moved.
        assert [m["id"] for m in applied.json()["applied"]] == ["L0.E1", "L1.E2"]
        assert applied.json()["skipped"] == [
            {"id": "L0.E0", "reason": "the adapter did not report it moved"}
        ]
        tiers = {
            e["id"]: e["tier"]
            for e in http.get("/werk/v1/experts", params={"model": "moe"}).json()["experts"]
        }
        assert sorted(e for e, t in tiers.items() if t == "ram") == ["L0.E1", "L1.E2"]
        # The host's policy engine holds a just-moved expert (cooldown); nothing is evicted.
        evict = {**action, "experts": ["L0.E1"], "target": "external"}
        evicted = http.post("/werk/v1/experts/moe/evict", json=evict)
        assert evicted.status_code == 200, evicted.text
        assert evicted.json()["skipped"] == [{"id": "L0.E1", "reason": "transition cooldown"}]
        listed = http.get("/werk/v1/experts", params={"model": "moe"}).json()["experts"]
        assert {e["id"]: e["tier"] for e in listed} == tiers
