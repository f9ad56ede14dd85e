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
        speech_events = _SpeechEvents(prepared, first)
        stream = _closing(pump(job, speech_events, serving.writes, request_id()), speech_events)
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


async def _audio(
    job: Job, prepared: PreparedSynthesis, first: JobItem, request: str
) -> AsyncIterator[bytes]:
    """The raw audio body, a piece at a time: wav (its header first, its length unknown) and
    pcm written here, other formats by the request's encoder as they come. Where the
    synthesis or the encoder failed midway it yields `DROP_CONNECTION`: the transfer is cut
    (`_keepalive.py`). Cancelled with the request (see the module's docstring)."""
    rate, compressed = prepared.sample_rate, prepared.compressed
    if prepared.format == "wav":
        yield wav_header(rate, None)
    encoder: SpeechEncoder | None = None
    try:
        if compressed is not None:
            encoder = SpeechEncoder.open(compressed, rate)
        item: JobItem | None = first
        while item is not None:
            if isinstance(item, AudioChunk):
                if encoder is None:
                    yield pcm16(item.samples)
                elif piece := await trio.to_thread.run_sync(encoder.encode, item.samples):
                    yield piece
            elif isinstance(item, Synthesized):
                if encoder is not None and (rest := await trio.to_thread.run_sync(encoder.finish)):
                    yield rest
                await job.settled()
                return
            else:  # the synthesis failed
                break
            item = await anext(job.receive, None)
    except Exception as exc:  # noqa: BLE001 - raw audio has no place for an error: cut
        log_failure(request, f"while writing speech as {prepared.format}", exc)
    finally:
        if encoder is not None:
            encoder.close()
    yield DROP_CONNECTION  # failed, or ended early: cut, never a short file that looks whole


async def _closing(stream: AsyncIterator[bytes], events: _SpeechEvents) -> AsyncIterator[bytes]:
    """`stream`, then the events' encoder closed, however the stream ends (a cancel too:
    the close runs as the body's iterator is closed)."""
    try:
        async for piece in stream:
            yield piece
    finally:
        events.close()


class _SpeechEvents:
    """OpenAI's speech events, a `StreamFormat`: a `speech.audio.delta` per piece of audio
    (base64 of the format's bytes: pcm, a wav's header in the first, or what the request's
    encoder completed, encoded on a worker thread), then `speech.audio.done`. An encoded
    format's first piece goes out with the first render, so that no encode runs on the Trio
    thread; `close` closes the encoder (the route's `_closing` calls it)."""

    def __init__(self, prepared: PreparedSynthesis, first: JobItem) -> None:
        self._header = prepared.format == "wav"
        self._rate = prepared.sample_rate
        self._first: JobItem | None = first
        self._compressed = prepared.compressed
        self._encoder: SpeechEncoder | None = None
        """Opened by the first render (not before the stream runs, so that nothing is left
        open by a response never sent)."""

    def opening(self) -> bytes:
        if self._compressed is not None:
            return b""  # the first render encodes it
        first, self._first = self._first, None
        assert first is not None
        out, _ = self._render([first], [])
        return out

    async def render(self, items: list[JobItem]) -> tuple[bytes, bool]:
        if self._first is not None:
            items, self._first = [self._first, *items], None
        encoded: list[bytes] = []
        if self._compressed is not None:
            if self._encoder is None:
                self._encoder = SpeechEncoder.open(self._compressed, self._rate)
            encoder = self._encoder
            for item in items:
                if isinstance(item, AudioChunk):
                    encoded.append(await trio.to_thread.run_sync(encoder.encode, item.samples))
                elif isinstance(item, Synthesized):
                    encoded.append(await trio.to_thread.run_sync(encoder.finish))
                    break
        return self._render(items, encoded)

    def _render(self, items: list[JobItem], encoded: list[bytes]) -> tuple[bytes, bool]:
        """`encoded`: the encoder's bytes for each chunk of `items` and, at the end, its rest."""
        out: list[bytes] = []
        pieces = iter(encoded)
        for item in items:
            if isinstance(item, AudioChunk):
                audio = next(pieces) if self._compressed is not None else pcm16(item.samples)
                if self._header:
                    audio, self._header = wav_header(self._rate, None) + audio, False
                if audio:
                    out.append(data_event(audio_delta_event(base64.b64encode(audio).decode())))
            elif isinstance(item, Synthesized):
                rest = next(pieces, b"")
                if rest:
                    out.append(data_event(audio_delta_event(base64.b64encode(rest).decode())))
                out.append(data_event(audio_done_event(item)))
                return b"".join(out), True
            elif isinstance(item, OpenAIError):
                out.append(self.error(item))
                return b"".join(out), True
        return b"".join(out), False

    def error(self, error: OpenAIError) -> bytes:
        return data_event(error.envelope())

    def close(self) -> None:
        if self._encoder is not None:
            self._encoder.close()
