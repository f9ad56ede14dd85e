"""Transcription (issue 22): the speech engine against mlx-audio's own `generate`, and how soon
a cancelled transcription's compute stops.

1. Real-time factor (seconds of compute per second of audio) of one clip, greedy (one
   temperature, so both sides decode the same tokens), in paired rounds: mlx-audio's
   `Model.generate` called directly on this thread, then the `SpeechEngine` (its own thread,
   the window loop that can stop, the Trio hop per window). Ratio = generate's time over
   ours, median of the rounds (the issue's target: >= 0.95).
2. Cancel -> compute stopped: a long clip (5 minutes by default) is transcribed; after the
   first window's text, the block is left (as a disconnect's cancel leaves it); the time
   until the engine's confirmation that the thread stopped (the lane returned), for several
   trials at varied points (after 1..N windows).

Usage: `python -P bench/audio.py [--model DIR | --preset tiny-whisper] [--clip WAV]
[--seconds 60] [--rounds 3] [--cancel-seconds 300] [--cancel-trials 5]`; prints JSON.
Without `--clip`, a synthetic clip (a tone under noise; a random model needs no speech).
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import trio

from mlx_nursery.engine import (
    SpeechConfig,
    SpeechEngine,
    Transcript,
    TranscriptionRequest,
    Window,
)
from mlx_nursery.models import load_speech_model
from mlx_nursery.tools import make_model


def synthetic(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16_000)) / 16_000
    tone = 0.3 * np.sin(2 * np.pi * (220 + 40 * np.sin(t)) * t)
    return (tone + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)


def read_clip(path: str, seconds: float) -> np.ndarray:
    from mlx_audio.audio_io import read

    samples, _ = read(
        io.BytesIO(Path(path).read_bytes()), dtype="float32", sample_rate=16_000, nchannels=1
    )
    audio = np.asarray(samples, dtype=np.float32).reshape(-1)
    reps = int(np.ceil(seconds * 16_000 / len(audio)))
    return np.tile(audio, reps)[: int(seconds * 16_000)]


async def ours(engine: SpeechEngine, audio: np.ndarray) -> tuple[float, Transcript]:
    start = time.perf_counter()
    async with engine.transcribe(TranscriptionRequest(audio, temperatures=(0.0,))) as events:
        result = None
        async for event in events:
            if isinstance(event, Transcript):
                result = event
    assert result is not None
    return time.perf_counter() - start, result


def theirs(model: Any, audio: np.ndarray) -> tuple[float, str]:
    start = time.perf_counter()
    out = model.generate(audio, temperature=0.0, fp16=model.dtype == mx.float16, language="en")
    mx.synchronize()
    return time.perf_counter() - start, out.text


async def cancel_trial(engine: SpeechEngine, audio: np.ndarray, windows: int) -> dict[str, Any]:
    seen = 0
    async with engine.transcribe(TranscriptionRequest(audio, temperatures=(0.0,))) as events:
        async for event in events:
            if isinstance(event, Window):
                seen += 1
                if seen >= windows:
                    break
        tokens_before = engine.statistics().tokens_decoded
        left = time.perf_counter()
    stopped = time.perf_counter() - left  # the block's exit waited for the confirmation
    stats = engine.statistics()
    assert stats.lanes_borrowed == 0 and not stats.running
    return {
        "after_windows": windows,
        "stop_ms": round(stopped * 1000, 2),
        "tokens_after_cancel": stats.tokens_decoded - tokens_before,
    }


async def run(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    audio = read_clip(args.clip, args.seconds) if args.clip else synthetic(args.seconds)
    long = (
        read_clip(args.clip, args.cancel_seconds)
        if args.clip
        else synthetic(args.cancel_seconds, seed=1)
    )
    model = load_speech_model(path).model  # mlx-audio's, on this thread, for `generate`
    out: dict[str, Any] = {"model": str(path), "seconds": args.seconds, "rounds": []}
    async with trio.open_nursery() as nursery:
        engine: SpeechEngine = await nursery.start(SpeechEngine(SpeechConfig(path)).run)
        await ours(engine, audio[: 16_000 * 2])  # warm-up, both sides
        theirs(model, audio[: 16_000 * 2])
        for _ in range(args.rounds):
            t_theirs, text_theirs = theirs(model, audio)
            t_ours, transcript = await ours(engine, audio)
            out["rounds"].append(
                {
                    "generate_s": round(t_theirs, 3),
                    "ours_s": round(t_ours, 3),
                    "ratio": round(t_theirs / t_ours, 3),
                    "rtf_generate": round(t_theirs / args.seconds, 4),
                    "rtf_ours": round(t_ours / args.seconds, 4),
                    "same_text": text_theirs == transcript.text,
                    "windows": transcript.windows,
                }
            )
        out["median_ratio"] = statistics.median(r["ratio"] for r in out["rounds"])
        out["cancel"] = [
            await cancel_trial(engine, long, 1 + i % 3) for i in range(args.cancel_trials)
        ]
        stops = [c["stop_ms"] for c in out["cancel"]]
        out["cancel_stop_ms"] = {"median": statistics.median(stops), "max": max(stops)}
        engine.close()
    out["target_ratio_met"] = out["median_ratio"] >= 0.95
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", help="a Whisper directory (default: make --preset)")
    parser.add_argument("--preset", default="tiny-whisper")
    parser.add_argument("--clip", help="a WAV/MP3/FLAC clip, looped to the lengths asked")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cancel-seconds", type=float, default=300.0)
    parser.add_argument("--cancel-trials", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.model) if args.model else make_model(Path(tmp) / "m", args.preset)
        result = trio.run(run, args, path)
    result["device"] = str(mx.default_device())
    result["machine"] = platform.machine()
    print(json.dumps(result, indent=2))
    mx.clear_streams()


if __name__ == "__main__":
    main()
