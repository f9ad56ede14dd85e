"""/v1/audio/speech: a JSON body in, audio out as the model makes it, sentence by sentence.

The route reads the body, leases the model it names (a speech-synthesis model: any other
kind is a 400), checks the body against the model (its voices) and runs the synthesis as a
job (`Jobs.start_audio`) tied to the request's lifetime: a disconnect, the request's
deadline or a shutdown stops the synthesis thread before its next piece of audio.

The response waits for the first piece, so that a synthesis that fails at once is a clean
error in OpenAI's envelope; from then on audio goes out as each piece is made: raw bytes
(wav, pcm) or `speech.audio.delta` events (sse). A failure after the first piece ends an
sse stream with an error event; raw audio has no place for one, so its body is cut (the
client sees a broken transfer, never a short file that looks whole). mp3, opus, aac and flac
go through ffmpeg once the audio is all made (one encoder run, not one per piece).
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import trio
from quart import Response

from ..engine import AudioChunk, Synthesized
from ..generation import OpenAIError, parse_json, requested_model
from ..openai import (
    PreparedSynthesis,
    audio_delta_event,
    audio_done_event,
    ffmpeg_command,
    ffmpeg_found,
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
            info, ffmpeg = engine.info, ffmpeg_found()
            prepared = prepare_synthesis(body, info, ffmpeg)
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
        stream = pump(job, _SpeechEvents(prepared, first), serving.writes, request_id())
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
    """The raw audio body: wav and pcm a piece at a time (a wav's header first, its length
    unknown), other formats encoded by ffmpeg at the end. Where the synthesis (or ffmpeg)
    failed midway it yields `DROP_CONNECTION`: the transfer is cut (`_keepalive.py`)."""
    rate, encode = prepared.sample_rate, prepared.format not in ("wav", "pcm")
    if prepared.format == "wav":
        yield wav_header(rate, None)
    kept: list[bytes] = []
    item: JobItem | None = first
    while item is not None:
        if isinstance(item, AudioChunk):
            pcm = pcm16(item.samples)
            if encode:
                kept.append(pcm)
            else:
                yield pcm
        elif isinstance(item, Synthesized):
            if encode:
                yield await _encoded(prepared, b"".join(kept), request)
            await job.settled()
            return
        elif isinstance(item, OpenAIError):
            break
        item = await anext(job.receive, None)
    yield DROP_CONNECTION  # failed, or ended early: cut, never a short file that looks whole


async def _encoded(prepared: PreparedSynthesis, pcm: bytes, request: str) -> bytes:
    """`pcm` as `prepared.format`, by ffmpeg (cancelled with the request: the process is
    killed); `DROP_CONNECTION` when ffmpeg fails (logged)."""
    command = ffmpeg_command(prepared.format, prepared.sample_rate)
    try:
        done = await trio.run_process(command, stdin=pcm, capture_stdout=True, capture_stderr=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        log_failure(request, "while encoding speech with ffmpeg", exc)
        return DROP_CONNECTION
    return bytes(done.stdout)


class _SpeechEvents:
    """OpenAI's speech events, a `StreamFormat`: a `speech.audio.delta` per piece of audio
    (base64; a wav's header in the first), then `speech.audio.done`."""

    def __init__(self, prepared: PreparedSynthesis, first: JobItem) -> None:
        self._header = prepared.format == "wav"
        self._rate = prepared.sample_rate
        self._first = first

    def opening(self) -> bytes:
        out, _ = self._render([self._first])
        return out

    async def render(self, items: list[JobItem]) -> tuple[bytes, bool]:
        return self._render(items)

    def _render(self, items: list[JobItem]) -> tuple[bytes, bool]:
        out: list[bytes] = []
        for item in items:
            if isinstance(item, AudioChunk):
                audio = pcm16(item.samples)
                if self._header:
                    audio, self._header = wav_header(self._rate, None) + audio, False
                out.append(data_event(audio_delta_event(base64.b64encode(audio).decode())))
            elif isinstance(item, Synthesized):
                out.append(data_event(audio_done_event(item)))
                return b"".join(out), True
            elif isinstance(item, OpenAIError):
                out.append(self.error(item))
                return b"".join(out), True
        return b"".join(out), False

    def error(self, error: OpenAIError) -> bytes:
        return data_event(error.envelope())
