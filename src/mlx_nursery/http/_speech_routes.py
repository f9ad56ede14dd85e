"""/v1/audio/speech: a JSON body in, audio out as the model makes it, sentence by sentence.

The route reads the body, leases the model it names (a speech-synthesis model: any other
kind is a 400), checks the body against the model (its voices) and runs the synthesis as a
job (`Jobs.start_audio`) tied to the request's lifetime: a disconnect, the request's
deadline or a shutdown stops the synthesis thread before its next piece of audio.

The response waits for the first piece, so that a synthesis that fails at once is a clean
error in OpenAI's envelope; from then on audio goes out as each piece is made: raw bytes
or `speech.audio.delta` events (sse), in any format. A failure after the first
piece ends an sse stream with an error event; raw audio has no place for one, so its body
is cut, whether the synthesis or the encoder failed (the client sees a broken transfer,
never a short file that looks whole).

mp3, opus, aac and flac stream too: each piece goes through the request's own encoder
(`openai.SpeechEncoder`, PyAV) on a worker thread, so that no encode stalls the Trio thread,
and what it completed goes out at once. A cancel (disconnect, deadline, shutdown) between
pieces stops there; one that comes while a piece is on the thread waits for that piece
(one encode), whose bytes are dropped. The encoder is closed when the body ends, however.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import trio
from quart import Response

from ..engine import AudioChunk, Synthesized
from ..generation import OpenAIError, parse_json, requested_model
from ..openai import (
    PreparedSynthesis,
    SpeechEncoder,
    audio_delta_event,
    audio_done_event,
    encodable,
    pcm16,
    prepare_synthesis,
    wav_header,
)
from ..serving import Job, JobItem, ended_early, log_failure, synthesizing
from ._generate import current_live, parts, request_body, request_id
from ._lifetime import current_record, own
from ._pump import DROP_CONNECTION, pump
from ._routes import routes
from ._sse import HEADERS, data_event


@routes.post("/v1/audio/speech")
async def create_speech() -> Response:
    serving = parts()
    service, preparation = serving.service, serving.preparation
    models = service.check_open()
    deadline = preparation.deadline()
    live = current_live()
    raw = await request_body()
    with live.guard():  # a cancel by the request's id stops it; then its job (`hold`)
        body: Any = await preparation.prepare(lambda: parse_json(raw), deadline)
        slot = models.find(requested_model(body)).expect("synthesis")
        async with models.lease(slot, deadline) as leased:
            hosted, engine = synthesizing(leased)
            writable = await trio.to_thread.run_sync(encodable)  # loads FFmpeg at first
            prepared = prepare_synthesis(body, engine.info, writable)
            events = partial(engine.synthesize, prepared.request)
            job = own(
                await hosted.jobs.start_audio(
                    events, "synthesis_failed", deadline, current_record()
                )
            )  # ends with the request
            live.hold(job)
        first = await _first(job)
    if prepared.sse and isinstance(first, Synthesized):  # nothing to speak: done at once
        await job.settled()
        done = data_event(audio_done_event(first))
        return Response(done, content_type=prepared.content_type, headers=HEADERS)
    if prepared.sse:
        assert isinstance(first, AudioChunk)
        audio_bytes = _AudioBytes(prepared, header=prepared.format == "wav")
        try:  # the first piece goes out at once, as the stream's opening
            opening = _delta(await audio_bytes.piece(first))
        except BaseException:
            audio_bytes.close()
            raise
        speech_events = _SpeechEvents(audio_bytes, opening)
        stream = _closing(pump(job, speech_events, serving.writes, request_id()), audio_bytes)
        response = Response(stream, content_type=prepared.content_type, headers=HEADERS)
    else:
        audio = _audio(job, prepared, first, request_id())
        response = Response(audio, content_type=prepared.content_type)
    response.timeout = None  # the job's deadline bounds the stream
    return response


async def _first(job: Job) -> AudioChunk | Synthesized:
    """The synthesis's first item; raises the error it ended with instead."""
    try:
        item = await job.receive.receive()
    except trio.EndOfChannel:
        raise ended_early() from None
    if isinstance(item, OpenAIError):
        raise item  # to the one handler (app.py), as every error
    assert isinstance(item, AudioChunk | Synthesized)
    return item


class _AudioBytes:
    """A synthesis's audio as the bytes of the request's format, a piece at a time: pcm
    (16-bit, a wav's header before its first piece where `header`) written here; mp3, opus,
    aac and flac by the request's own encoder, opened at its first use, each piece encoded on
    a worker thread so that no encode stalls the Trio thread (a cancel waits for the piece
    on the thread). `close` closes the encoder: call it however the body ends."""

    def __init__(self, prepared: PreparedSynthesis, *, header: bool) -> None:
        self._compressed = prepared.compressed
        self._rate = prepared.sample_rate
        self._header = header
        self._encoder: SpeechEncoder | None = None

    def _opened(self) -> SpeechEncoder:
        if self._encoder is None:
            assert self._compressed is not None
            self._encoder = SpeechEncoder.open(self._compressed, self._rate)
        return self._encoder

    async def piece(self, chunk: AudioChunk) -> bytes:
        """The bytes of `chunk`'s audio (an encoder may hold them back: b"")."""
        if self._compressed is None:
            audio = pcm16(chunk.samples)
        else:
            audio = await trio.to_thread.run_sync(self._opened().encode, chunk.samples)
        if self._header:
            audio, self._header = wav_header(self._rate, None) + audio, False
        return audio

    async def rest(self) -> bytes:
        """What the encoder held back, at the audio's end (a whole file's ends, for audio
        with no piece); nothing for pcm and wav."""
        if self._compressed is None:
            return b""
        return await trio.to_thread.run_sync(self._opened().finish)

    def close(self) -> None:
        if self._encoder is not None:
            self._encoder.close()


async def _audio(
    job: Job, prepared: PreparedSynthesis, first: JobItem, request: str
) -> AsyncIterator[bytes]:
    """The raw audio body, a piece at a time (`_AudioBytes`; a wav's header first, its
    length unknown). Where the synthesis or the encoder failed midway it yields
    `DROP_CONNECTION`: the transfer is cut (`_keepalive.py`). Cancelled with the request (see
    the module's docstring)."""
    if prepared.format == "wav":
        yield wav_header(prepared.sample_rate, None)
    audio_bytes = _AudioBytes(prepared, header=False)
    try:
        item: JobItem | None = first
        while item is not None:
            if isinstance(item, AudioChunk):
                if piece := await audio_bytes.piece(item):
                    yield piece
            elif isinstance(item, Synthesized):
                if rest := await audio_bytes.rest():
                    yield rest
                await job.settled()
                return
            else:  # the synthesis failed
                break
            item = await anext(job.receive, None)
    except Exception as exc:  # noqa: BLE001 - raw audio has no place for an error: cut
        log_failure(request, f"while writing speech as {prepared.format}", exc)
    finally:
        audio_bytes.close()
    yield DROP_CONNECTION  # failed, or ended early: cut, never a short file that looks whole


async def _closing(stream: AsyncIterator[bytes], audio_bytes: _AudioBytes) -> AsyncIterator[bytes]:
    """`stream`, then the audio's encoder closed, however the stream ends (a cancel too:
    the close runs as the body's iterator is closed)."""
    try:
        async for piece in stream:
            yield piece
    finally:
        audio_bytes.close()


def _delta(audio: bytes) -> bytes:
    """A `speech.audio.delta` event of `audio` (base64), or nothing for no audio."""
    return data_event(audio_delta_event(base64.b64encode(audio).decode())) if audio else b""


class _SpeechEvents:
    """OpenAI's speech events, a `StreamFormat`: a `speech.audio.delta` per piece of audio
    (base64 of the format's bytes, `_AudioBytes`), then `speech.audio.done`. `opening` is the
    first piece's delta, made by the route before the stream starts."""

    def __init__(self, audio_bytes: _AudioBytes, opening: bytes) -> None:
        self._audio_bytes = audio_bytes
        self._opening = opening

    def opening(self) -> bytes:
        return self._opening

    async def render(self, items: list[JobItem]) -> tuple[bytes, bool]:
        out: list[bytes] = []
        for item in items:
            if isinstance(item, AudioChunk):
                out.append(_delta(await self._audio_bytes.piece(item)))
            elif isinstance(item, Synthesized):
                out.append(_delta(await self._audio_bytes.rest()))
                out.append(data_event(audio_done_event(item)))
                return b"".join(out), True
            elif isinstance(item, OpenAIError):
                out.append(await self.error(item))
                return b"".join(out), True
        return b"".join(out), False

    async def error(self, error: OpenAIError) -> bytes:
        return data_event(error.envelope())
