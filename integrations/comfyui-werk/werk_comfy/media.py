"""Werk's PNG and WAV answers as ComfyUI's IMAGE and AUDIO values.

IMAGE is a float32 tensor ``[batch, height, width, channels]`` in 0..1 (RGB); AUDIO is
``{"waveform": float32 tensor [batch, channels, samples] in -1..1, "sample_rate": int}``, as
ComfyUI's ``LoadImage`` and ``LoadAudio`` make them. torch, numpy and Pillow are imported on
use: ComfyUI's environment has them; nothing else in the pack needs them.
"""

from __future__ import annotations

import io
import wave
from typing import Any

__all__ = ["pngs_to_image", "wav_to_audio"]


def pngs_to_image(pngs: list[bytes]) -> Any:
    """One IMAGE batch of the decoded images (all of one size, as one request makes them)."""
    import numpy as np
    import torch  # type: ignore[import-not-found]  # ComfyUI's environment has it
    from PIL import Image

    frames = []
    for raw in pngs:
        with Image.open(io.BytesIO(raw)) as image:
            rgb = image.convert("RGB")
        frames.append(np.asarray(rgb, dtype=np.float32) / 255.0)
    return torch.from_numpy(np.stack(frames))


def wav_to_audio(raw: bytes) -> dict[str, Any]:
    """A 16-bit PCM WAV (what Werk's speech answers) as AUDIO."""
    import numpy as np
    import torch

    with wave.open(io.BytesIO(raw)) as wav:
        if wav.getsampwidth() != 2:
            raise ValueError(f"expected 16-bit PCM, got {8 * wav.getsampwidth()}-bit samples")
        channels, rate = wav.getnchannels(), wav.getframerate()
        frames = wav.readframes(wav.getnframes())
    samples = np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0
    waveform = samples.reshape(-1, channels).T.copy()  # [channels, samples]
    return {"waveform": torch.from_numpy(waveform).unsqueeze(0), "sample_rate": rate}
