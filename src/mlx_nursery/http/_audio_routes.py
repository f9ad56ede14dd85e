"""/v1/audio/transcriptions and /v1/audio/translations: a multipart form in, a transcript out
(JSON, text, subtitles), or OpenAI's `transcript.text.*` SSE events.

The route reads the form, leases the model it names (a speech model: a text model is a
400), checks the form and decodes the audio on a preparation thread, and runs the
transcription as a job (`Jobs.start_audio`) tied to the request's lifetime: a
disconnect, the request's deadline or a shutdown stops the speech thread within a decoder
token, as a text job's compute stops within a step.

The body limit: `--max-request-bytes` (8 MiB) bounds every JSON body, but OpenAI takes audio
up to 25 MB. Quart fixes a request's limit when it makes the request, before any body byte
arrives, from `MAX_CONTENT_LENGTH`; so the app's request class (`request_class_for`) gives
these two paths `--max-audio-bytes` (plus room for the form's other fields) instead.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from quart import Response, request
from quart_trio.wrappers import TrioRequest
from werkzeug.exceptions import RequestEntityTooLarge

from ..engine import SpeechEngine, SpeechTask, Transcript, Window
from ..generation import (
    AudioUpload,
    InvalidRequest,
    OpenAIError,
    RequestTooLarge,
    UnsupportedMediaType,
    quoted,
)
from ..openai import (
    PreparedSpeech,
    delta_event,
    done_event,
    prepare_speech,
    speech_model_name,
    transcript_body,
)
from ..serving import Job, JobItem, ended_early, speaking
from ._errors import leave_body_unread
from ._generate import current_live, parts, request_id
from ._lifetime import current_record, own
from ._pump import pump
from ._routes import routes
from ._sse import HEADERS, data_event

AUDIO_PATHS = ("/v1/audio/transcriptions", "/v1/audio/translations")
_FORM_ROOM = 1 << 20
"""Body bytes beyond the audio limit: the form's other fields and its part headers."""


def request_class_for(max_audio_bytes: int) -> type[TrioRequest]:
    """The app's request class: the audio paths' body limit is `max_audio_bytes` plus the
    form's room, every other path's the app's `MAX_CONTENT_LENGTH`."""

    class Request(TrioRequest):
        def __init__(self, method: str, scheme: str, path: str, *args: Any, **kwargs: Any):
            if path in AUDIO_PATHS:
                kwargs["max_content_length"] = max_audio_bytes + _FORM_ROOM
            super().__init__(method, scheme, path, *args, **kwargs)

    return Request


@routes.post("/v1/audio/transcriptions")
async def transcriptions() -> Response:
    return await _speech("transcribe")


@routes.post("/v1/audio/translations")
async def translations() -> Response:
    return await _speech("translate")


async def _speech(task: SpeechTask) -> Response:
    serving = parts()
    models = serving.service.check_open()
    deadline = serving.preparation.deadline()
    live = current_live()
    fields, upload = await _read_form(serving.audio_limits.max_bytes)
    with live.guard():  # a cancel by the request's id stops it; then its job (`hold`)
        slot = models.find(speech_model_name(fields)).expect("speech")
        async with models.lease(slot, deadline) as leased:
            hosted, engine = speaking(leased)
            limits, info = serving.audio_limits, engine.info
            prepared = await serving.preparation.prepare(
                lambda: prepare_speech(task, fields, upload, info, limits), deadline
            )
            events = partial(engine.transcribe, prepared.request)
            job = own(
                await hosted.jobs.start_audio(
                    events, "transcription_failed", deadline, current_record()
                )
            )  # ends with the request
            live.hold(job)
    if prepared.stream:
        body = pump(job, _TranscriptStream(), serving.writes, request_id())
        response = Response(body, content_type="text/event-stream", headers=HEADERS)
        response.timeout = None  # the job's deadline bounds the stream
        return response
    return await _collect(prepared, job, engine)


async def _read_form(max_audio_bytes: int) -> tuple[dict[str, list[str]], AudioUpload | None]:
    """The form's text fields (name -> values) and its `file` part. 415 for a body that is
    not multipart/form-data, which a file needs, before any of it is read: a urlencoded form
    has no file, and would be parsed whole on the Trio thread with no bound on its fields;
    413 past the audio limit (with the form's room)."""
    if request.mimetype != "multipart/form-data":
        leave_body_unread()
        raise UnsupportedMediaType(
            "the request body must be multipart/form-data (the audio in a `file` part), got "
            f"{quoted(request.headers.get('Content-Type', 'none'))}",
            code="unsupported_media_type",
        )
    try:
        form = await request.form
        files = await request.files
    except RequestEntityTooLarge:
        raise RequestTooLarge(
            f"the request body is larger than this server's audio limit ({max_audio_bytes} "
            "bytes of audio: --max-audio-bytes)",
            param="file",
            code="audio_too_large",
        ) from None
    fields = {name: form.getlist(name) for name in form}
    parts = files.getlist("file")
    if len(parts) > 1:
        raise InvalidRequest("file is given more than once", param="file")
    for name in files:
        if name != "file":
            raise InvalidRequest(
                f"Unrecognized request argument supplied: {quoted(name)}", param=name
            )
    upload = None
    if parts:
        upload = AudioUpload(parts[0].filename or "", parts[0].read(max_audio_bytes + 1))
    if "file" in fields:
        raise InvalidRequest("file must be a file part, not a text field", param="file")
    return fields, upload


async def _collect(prepared: PreparedSpeech, job: Job, engine: SpeechEngine) -> Response:
    async for item in job.receive:
        if isinstance(item, Transcript):
            await job.settled()
            body, content_type = transcript_body(prepared, item, engine.info)
            data = json.dumps(body) if not isinstance(body, str) else body
            return Response(data, content_type=content_type)
        if isinstance(item, OpenAIError):
            raise item  # to the one handler (app.py), as every error
    raise ended_early()


class _TranscriptStream:
    """OpenAI's transcription events, a `StreamFormat`: a delta per window with new text,
    then `transcript.text.done`."""

    def opening(self) -> bytes:
        return b""

    async def render(self, items: list[JobItem]) -> tuple[bytes, bool]:
        out: list[bytes] = []
        for item in items:
            if isinstance(item, Window):
                if item.text:
                    out.append(data_event(delta_event(item.text)))
            elif isinstance(item, Transcript):
                out.append(data_event(done_event(item)))
                return b"".join(out), True
            elif isinstance(item, OpenAIError):
                out.append(await self.error(item))
                return b"".join(out), True
        return b"".join(out), False

    async def error(self, error: OpenAIError) -> bytes:
        return data_event(error.envelope())
