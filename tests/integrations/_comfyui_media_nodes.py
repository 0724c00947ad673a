"""Runs Werk Image and Werk Speech in a Python with torch, numpy and Pillow — what ComfyUI's
environment has — and prints what came out as JSON (one line). Used by
``test_comfyui_served.py`` with the media backend's managed environment.

``comfy.utils.ProgressBar`` and ``comfy.model_management`` are stand-ins here for ComfyUI's
own (the real ones need ComfyUI's whole import tree): they record the progress the node
reports; the opt-in real-ComfyUI test runs the nodes under the real ones.

argv: the pack's directory, then a JSON object {"base_url", "key_variable", "image": {...},
"speech": {...}} of node inputs.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any

PROGRESS: list[tuple[int, int, str | None]] = []


class ProgressBar:
    def __init__(self, total: int, node_id: str | None = None) -> None:
        self.total, self.node_id = total, node_id

    def update_absolute(self, value: int, total: int | None = None, preview: Any = None) -> None:
        PROGRESS.append((value, self.total, self.node_id))


def _install_comfy_stand_ins() -> None:
    comfy = types.ModuleType("comfy")
    utils = types.ModuleType("comfy.utils")
    utils.ProgressBar = ProgressBar  # type: ignore[attr-defined]
    management = types.ModuleType("comfy.model_management")
    management.processing_interrupted = lambda: False  # type: ignore[attr-defined]
    comfy.utils, comfy.model_management = utils, management  # type: ignore[attr-defined]
    sys.modules.update({"comfy": comfy, "comfy.utils": utils, "comfy.model_management": management})


def _tensor(value: Any) -> dict[str, Any]:
    return {
        "shape": list(value.shape),
        "dtype": str(value.dtype),
        "min": float(value.min()),
        "max": float(value.max()),
        "sum": float(value.double().sum()),
    }


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    args = json.loads(sys.argv[2])
    _install_comfy_stand_ins()
    import werk_comfy

    nodes = werk_comfy.NODE_CLASS_MAPPINGS
    (server,) = nodes["WerkServer"]().connect(args["base_url"], args["key_variable"])
    (image,) = nodes["WerkImage"]().generate(**args["image"], server=server)
    (audio,) = nodes["WerkSpeech"]().speak(**args["speech"], server=server, unique_id="7")
    print(
        json.dumps(
            {
                "image": _tensor(image),
                "audio": {**_tensor(audio["waveform"]), "sample_rate": audio["sample_rate"]},
                "progress": PROGRESS,
            }
        )
    )


if __name__ == "__main__":
    main()
