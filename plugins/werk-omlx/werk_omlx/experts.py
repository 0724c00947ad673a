"""The oMLX expert adapter: a bounded LRU of real MoE expert tensors, sliced from the model's
own safetensors files.

**Supported checkpoints.** DeepSeek-family MoE checkpoints (the seed names DeepSeek V4; tested
with a tiny ``deepseek_v3`` written by ``mlx_lm``) in MLX's affine-quantised layout:
``config.json`` with a ``model_type`` starting with ``deepseek``, ``n_routed_experts`` > 0 and a
``quantization`` object (``mode`` absent or ``affine``), and the experts of each MoE layer
stacked in ``model.layers.<L>.mlp.switch_mlp.<gate_proj|up_proj|down_proj>.<weight|scales|
biases>`` with the expert index first (the layout ``mlx_lm`` writes). Shards are found through
``model.safetensors.index.json`` or the single ``model.safetensors``.

**Activation.** Only with a positive ``WERK_OMLX_EXPERT_CACHE_MB`` (the cache's bound in MiB,
fractions allowed);
oMLX's own automatic expert selection is not visible from outside the worker, so it does not
activate this adapter. On activation a self-check opens every shard (memory-mapped, through the
``safetensors`` package), checks every expert tensor's shape against ``n_routed_experts`` and
reads the first expert's slices; any failure (a missing or corrupt shard, a missing tensor)
leaves the adapter *unavailable* with the reason, and nothing crashes.

**What it does.** Expert ``L<layer>.E<index>`` is its 9 slices (3 projections × weight, scales,
biases). Observing reports every expert: ``ram`` while its slices are in the cache, else
``external`` (on disk), with its exact byte size from the file headers; routing inside the
worker is not visible, so no accesses are reported. Moving to ``ram`` reads the slices into the
cache (evicting least recently used experts to stay within the bound), to ``external`` drops
them; ``vram`` does not exist on Apple's unified memory and fails. A move is reported only for
the experts it really changed. The tensors live in the Werk process, beside the worker: this is
Werk's expert cache, not oMLX's.
"""

from __future__ import annotations

import collections
import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["BUDGET_ENV", "ExpertAdapter", "adapter_for"]

BUDGET_ENV = "WERK_OMLX_EXPERT_CACHE_MB"
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
PARTS = ("weight", "scales", "biases")
_EXPERT_ID = re.compile(r"^L(\d+)\.E(\d+)$")
_KEY = re.compile(r"^model\.layers\.(\d+)\.mlp\.switch_mlp\.(\w+)\.(weight|scales|biases)$")
_DTYPE_BYTES = {
    "F32": 4, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "U8": 1, "I8": 1, "F64": 8,
    "U16": 2, "I16": 2, "I64": 8, "U64": 8,
}  # fmt: skip


class Unsupported(Exception):
    """Not a checkpoint this adapter handles (the reason is the message)."""


@dataclass
class ExpertAdapter:
    """The adapter of one model directory (see the module docstring)."""

    model_dir: Path
    budget: int
    layers: list[int] = field(default_factory=list)
    experts_per_layer: int = 0
    problem: str | None = None
    _shards: dict[str, Path] = field(default_factory=dict)
    _sizes: dict[str, int] = field(default_factory=dict)
    _cache: collections.OrderedDict[str, dict[str, Any]] = field(
        default_factory=collections.OrderedDict
    )
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- set-up --------------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self.problem is None

    def self_check(self) -> None:
        """Open the shards, check every expert tensor, read the first expert (sets
        :attr:`problem` instead of raising)."""
        try:
            self._check()
        except Exception as exc:  # a broken checkpoint makes the adapter unavailable
            self.problem = f"the expert self-check failed: {type(exc).__name__}: {exc}"[:300]
        else:
            self.problem = None

    def _check(self) -> None:
        from safetensors import safe_open

        tensors: dict[str, tuple[str, list[int], str]] = {}
        for shard in sorted(set(self._shards.values())):
            with safe_open(str(shard), framework="numpy") as opened:
                for key in opened.keys():  # noqa: SIM118 - safe_open has no __iter__
                    if _KEY.match(key):
                        sliced = opened.get_slice(key)
                        tensors[key] = (str(shard), list(sliced.get_shape()), sliced.get_dtype())
        missing = [k for k in self._expected_keys() if k not in tensors]
        if missing:
            raise LookupError(f"{len(missing)} expert tensor(s) missing, e.g. {missing[0]}")
        for key, (_, shape, dtype) in tensors.items():
            if not shape or shape[0] != self.experts_per_layer:
                raise ValueError(f"{key} has {shape[:1]} experts, not {self.experts_per_layer}")
            if dtype not in _DTYPE_BYTES:
                raise ValueError(f"{key} has the unsupported dtype {dtype}")
        for layer in self.layers:
            for index in range(self.experts_per_layer):
                self._sizes[f"L{layer}.E{index}"] = sum(
                    _DTYPE_BYTES[tensors[k][2]] * _product(tensors[k][1][1:])
                    for k in self._keys(layer)
                )
        first = f"L{self.layers[0]}.E0"
        slices = self._read(first)
        if sum(int(a.nbytes) for a in slices.values()) != self._sizes[first]:
            raise ValueError(f"expert {first} read back with another size than its header")

    def _keys(self, layer: int) -> list[str]:
        prefix = f"model.layers.{layer}.mlp.switch_mlp"
        return [f"{prefix}.{proj}.{part}" for proj in PROJECTIONS for part in PARTS]

    def _expected_keys(self) -> list[str]:
        return [key for layer in self.layers for key in self._keys(layer)]

    def _read(self, expert_id: str) -> dict[str, Any]:
        """The expert's slices, read from the memory-mapped shards into owned arrays."""
        from safetensors import safe_open

        layer, index = _parse(expert_id)
        arrays: dict[str, Any] = {}
        for key in self._keys(layer):
            with safe_open(str(self._shards[key]), framework="numpy") as opened:
                arrays[key] = opened.get_slice(key)[index].copy()
        return arrays

    # -- observing and moving -------------------------------------------------------------------

    def observe(self) -> list[tuple[str, str, int]]:
        """``(expert id, tier, bytes)`` for every expert: ``ram`` when cached, else
        ``external``."""
        with self._lock:
            cached = set(self._cache)
        return [
            (expert, "ram" if expert in cached else "external", size)
            for expert, size in self._sizes.items()
        ]

    def cached_bytes(self) -> int:
        with self._lock:
            return sum(self._sizes[e] for e in self._cache)

    def move(self, expert_ids: list[str], target: str) -> tuple[list[str], list[str]]:
        """Move the experts; returns ``(moved, failed)``. An expert already on the target tier
        is in neither: only what really changed is reported moved."""
        moved: list[str] = []
        failed: list[str] = []
        for expert in expert_ids:
            outcome = self._move_one(expert, target)
            if outcome == "moved":
                moved.append(expert)
            elif outcome == "failed":
                failed.append(expert)
        if target == "ram":  # one loaded early may have been evicted by a later one
            with self._lock:
                gone = [e for e in moved if e not in self._cache]
            moved = [e for e in moved if e not in gone]
            failed += gone
        return moved, failed

    def _move_one(self, expert: str, target: str) -> str:
        if expert not in self._sizes:
            return "failed"
        if target == "external":
            with self._lock:
                dropped = self._cache.pop(expert, None)
            return "moved" if dropped is not None else "unchanged"
        if target != "ram" or self._sizes[expert] > self.budget:
            return "failed"  # no VRAM on unified memory, or larger than the whole cache
        with self._lock:
            if expert in self._cache:
                self._cache.move_to_end(expert)
                return "unchanged"
        try:
            arrays = self._read(expert)
        except Exception:  # a shard went bad after the self-check: report, do not crash
            return "failed"
        with self._lock:
            while self._cache and self._used() + self._sizes[expert] > self.budget:
                self._cache.popitem(last=False)
            self._cache[expert] = arrays
        return "moved"

    def _used(self) -> int:
        return sum(self._sizes[e] for e in self._cache)


def _parse(expert_id: str) -> tuple[int, int]:
    found = _EXPERT_ID.match(expert_id)
    if not found:
        raise KeyError(expert_id)
    return int(found.group(1)), int(found.group(2))


def _layer_of(key: str) -> int:
    found = _KEY.match(key)
    return int(found.group(1)) if found else -1


def _product(values: list[int]) -> int:
    total = 1
    for value in values:
        total *= value
    return total


def _shards(model_dir: Path) -> dict[str, Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}
        return {str(k): model_dir / str(v) for k, v in weight_map.items() if _KEY.match(str(k))}
    single = model_dir / "model.safetensors"
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="numpy") as opened:
            return {k: single for k in opened.keys() if _KEY.match(k)}  # noqa: SIM118
    raise Unsupported("no model.safetensors or model.safetensors.index.json")


def budget_bytes() -> int | None:
    """``WERK_OMLX_EXPERT_CACHE_MB`` in bytes (a positive number of MiB, fractions allowed)."""
    try:
        mib = float(os.environ.get(BUDGET_ENV, ""))
    except ValueError:
        return None
    if not 0 < mib < float("inf"):  # NaN fails too
        return None
    return max(1, int(mib * 1024 * 1024))


def adapter_for(model_dir: Path) -> ExpertAdapter:
    """The adapter for ``model_dir``, self-checked; :class:`Unsupported` when the checkpoint is
    not a supported MoE one or no budget is configured."""
    budget = budget_bytes()
    if budget is None:
        raise Unsupported(f"{BUDGET_ENV} is not set to a positive number of MiB")
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Unsupported(f"config.json is unreadable: {exc}") from None
    model_type = str(config.get("model_type", ""))
    experts = config.get("n_routed_experts")
    quantization = config.get("quantization")
    if not model_type.startswith("deepseek"):
        raise Unsupported(f"model_type {model_type!r} is not a DeepSeek MoE")
    if not isinstance(experts, int) or experts <= 0:
        raise Unsupported("config.json names no routed experts (n_routed_experts)")
    if not isinstance(quantization, dict) or quantization.get("mode", "affine") != "affine":
        raise Unsupported("the checkpoint is not affine-quantised (MLX's quantization)")
    adapter = ExpertAdapter(model_dir=model_dir, budget=budget, experts_per_layer=experts)
    try:
        adapter._shards = _shards(model_dir)
    except (OSError, ValueError) as exc:
        adapter.problem = f"the expert self-check failed: {exc}"[:300]
        return adapter
    except Unsupported:
        raise
    except Exception as exc:  # a corrupt single file
        adapter.problem = f"the expert self-check failed: {type(exc).__name__}: {exc}"[:300]
        return adapter
    adapter.layers = sorted({_layer_of(key) for key in adapter._shards})
    if not adapter.layers:
        raise Unsupported("no switch_mlp expert tensors in the checkpoint")
    adapter.self_check()
    return adapter
