"""Audio for the speech tests: deterministic clips, as arrays and as WAV bytes."""

from __future__ import annotations

import io
import struct
import subprocess
import wave
from pathlib import Path

import numpy as np
import numpy.typing as npt

RATE = 16_000


def clip(seconds: float, seed: int = 0) -> npt.NDArray[np.float32]:
    """A deterministic clip: a wandering tone under noise (a random Whisper needs no speech)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    tone = 0.3 * np.sin(2 * np.pi * (220 + 40 * np.sin(t)) * t)
    return (tone + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)


def wav_bytes(samples: npt.NDArray[np.float32], rate: int = RATE, channels: int = 1) -> bytes:
    """16-bit PCM WAV of `samples` (repeated across `channels`)."""
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    if channels > 1:
        pcm = np.repeat(pcm[:, None], channels, axis=1).reshape(-1)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return out.getvalue()


def flac_bytes(rate: int, channels: int, frames: int, *, block: int = 65_535) -> bytes:
    """A 16-bit FLAC of `frames` frames of silence: each block of `block` frames is a frame
    of CONSTANT subframes, some bytes whatever the rate, so hours of audio fit in kilobytes
    (what an attacker sends). The header states the rate, channels and length."""
    info = bytearray(struct.pack(">HH", min(block, frames), block))
    info += bytes(6)  # frame sizes: unknown
    packed = (rate << 44) | ((channels - 1) << 41) | (15 << 36) | frames
    info += packed.to_bytes(8, "big") + bytes(16)  # no MD5
    out = bytearray(b"fLaC" + bytes([0x80, 0, 0, len(info)]) + info)
    for number, start in enumerate(range(0, frames, block)):
        size = min(block, frames - start)
        head = bytearray([0xFF, 0xF8, 0x70, (channels - 1) << 4])
        head += _utf8_number(number) + struct.pack(">H", size - 1)
        head.append(_crc8(head))
        frame = head + bytes(3) * channels  # a CONSTANT subframe of 0 per channel
        out += frame + struct.pack(">H", _crc16(frame))
    return bytes(out)


def _utf8_number(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    length = 2 if n < 0x800 else 3 if n < 0x10000 else 4 if n < 0x200000 else 5
    tail = [0x80 | ((n >> (6 * i)) & 0x3F) for i in range(length - 2, -1, -1)]
    lead = ((0xFF00 >> length) & 0xFF) | (n >> (6 * (length - 1)))
    return bytes([lead, *tail])


def _crc_table(poly: int, bits: int) -> list[int]:
    top, mask = 1 << (bits - 1), (1 << bits) - 1
    table = []
    for byte in range(256):
        crc = byte << (bits - 8)
        for _ in range(8):
            crc = ((crc << 1) ^ poly) & mask if crc & top else (crc << 1) & mask
        table.append(crc)
    return table


_CRC8 = _crc_table(0x07, 8)
_CRC16 = _crc_table(0x8005, 16)


def _crc8(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = _CRC8[crc ^ byte]
    return crc


def _crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[(crc >> 8) ^ byte]
    return crc


def encoded_tone(ffmpeg: Path, path: Path, seconds: float, *codec: str) -> bytes:
    """`seconds` of a 440 Hz tone at 44.1 kHz stereo, encoded by `ffmpeg` into `path`'s
    container with `codec`'s options."""
    source = f"sine=frequency=440:sample_rate=44100:duration={seconds}"
    subprocess.run(
        [str(ffmpeg), "-v", "error", "-f", "lavfi", "-i", source, "-ac", "2", *codec, str(path)],
        check=True,
    )
    return path.read_bytes()
