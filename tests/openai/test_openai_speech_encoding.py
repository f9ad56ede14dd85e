"""Speech's encoders and formats without a server: a rate a codec does not take is resampled,
bad samples are written as silence or clipped, and a build without an encoder refuses its
format by name (and falls back to wav where the default, mp3, is the missing one)."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from mlx_nursery.engine import SynthesisModelInfo
from mlx_nursery.generation import InvalidRequest
from mlx_nursery.openai import SpeechEncoder, encodable, prepare_synthesis

MODEL = SynthesisModelInfo("tts", "kitten_tts", 24_000, ("alloy",))


def _decoded(data: bytes) -> tuple[int, int]:
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(container.streams.audio[0]))
    return frames[0].sample_rate, sum(f.samples for f in frames)


def test_every_compressed_format_is_writable_with_the_wheels_codecs() -> None:
    assert encodable() == {"mp3", "opus", "aac", "flac"}


@pytest.mark.parametrize("rate", [22_050, 44_100])
def test_opus_resamples_a_rate_its_codec_lacks(rate: int) -> None:
    """libopus takes 8 to 48 kHz in five steps, neither of these: the encoder resamples to
    the next one up. The chunks' NaN and out-of-range samples are written, not refused."""
    encoder = SpeechEncoder.open("opus", rate)
    chunks = [np.sin(np.arange(rate // 2, dtype=np.float32) / 7) * 0.3 for _ in range(3)]
    chunks[1][:100] = np.nan
    chunks[2][:100] = 4.0
    try:
        data = b"".join(encoder.encode(chunk) for chunk in chunks) + encoder.finish()
    finally:
        encoder.close()
    decoded_rate, samples = _decoded(data)
    assert decoded_rate == 48_000
    assert samples == pytest.approx(1.5 * 48_000, abs=48)  # a resampler's sample or two


def test_a_missing_encoder_is_a_400_naming_its_format() -> None:
    body = {"model": "tts", "input": "Hi.", "voice": "alloy"}
    without_mp3 = frozenset({"opus", "aac", "flac"})
    with pytest.raises(InvalidRequest) as refused:
        prepare_synthesis(body | {"response_format": "mp3"}, MODEL, without_mp3)
    assert refused.value.param == "response_format" and "mp3" in str(refused.value)
    assert prepare_synthesis(body, MODEL, without_mp3).format == "wav"
    assert prepare_synthesis(body, MODEL, encodable()).format == "mp3"
    sse = body | {"stream_format": "sse"}
    assert prepare_synthesis(sse, MODEL, encodable()).format == "mp3"  # as OpenAI's example
    assert prepare_synthesis(sse, MODEL, without_mp3).format == "pcm"
