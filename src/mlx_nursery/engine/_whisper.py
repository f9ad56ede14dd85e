"""Whisper's window loop on the speech thread, stoppable between windows and between tokens.

mlx-audio's `Model.generate` runs the whole clip in one call, with no way to stop it or to
see a window's segments before the last window is done. So this module runs the same loop
(`mlx_audio/stt/models/whisper/whisper.py`, 0.6.2) with mlx-audio's own parts: its log-mel
spectrogram, its `DecodingTask` for each window (the same options, filters, timestamp rules
and fallback thresholds), its `add_word_timestamps`. Three things differ, and only these:

- `check()` runs before every decoder step (`_Inference.logits`, the one call
  `DecodingTask` makes per token) and before every window; it raises (the speech thread's
  `_lane_worker.Stopped`) to end the transcription there. Nothing after it runs: the
  compute stops within a token.
- Each window's segments and new text go out as it ends (`emit`), for streaming.
- Sampling above temperature 0 draws from a key seeded per request (`_KeyedDecoder`),
  not MLX's global random state, which other models' threads share.

Not ported: `hallucination_silence_threshold` and `clip_timestamps` (off by default in
mlx-audio and not in OpenAI's API). `tests/engine/test_speech_engine.py` checks that the
segments and text equal `generate`'s on a clip of several windows.

Runs on the thread that owns the model; makes MLX calls. Importing it imports mlx-audio's
speech models (through `_upstream`): the speech thread imports it, not the server's startup.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np

from ._speech_types import Segment, Transcript, TranscriptionRequest, Window, Word
from ._upstream import (
    FRAMES_PER_SECOND,
    HOP_LENGTH,
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
    TO_LANGUAGE_CODE,
    DecodingOptions,
    DecodingTask,
    GreedyDecoder,
    Inference,
    add_word_timestamps,
    detect_language,
    log_mel_spectrogram,
    pad_or_trim,
)
from ._upstream import LANGUAGES as _CODES_TO_NAMES

COMPRESSION_RATIO_THRESHOLD = 2.4
LOGPROB_THRESHOLD = -1.0
NO_SPEECH_THRESHOLD = 0.6
"""mlx-audio's (and OpenAI Whisper's) defaults for the fallback and the silence skip."""


LANGUAGES: dict[str, str] = {**{code: code for code in _CODES_TO_NAMES}, **TO_LANGUAGE_CODE}
"""Whisper's languages, by ISO-639-1 code or English name, to their code."""


Check = Callable[[], None]


def prepare(model: Any) -> None:
    """Once the model is loaded, on its thread: evaluate mlx-audio's cached mel filter bank.

    `mel_filters` is an `lru_cache` of a lazy MLX array, shared by the process. Made by a
    transcription stopped before its first evaluation, it would stay bound to that thread's
    stream, and after the model's thread ends every later one (the model loaded again)
    would fail on it ("There is no Stream(cpu, 1) in current thread")."""
    mx.eval(log_mel_spectrogram(mx.zeros(SAMPLE_RATE), n_mels=model.dims.n_mels))


def transcribe(
    model: Any,
    request: TranscriptionRequest,
    check: Check,
    emit: Callable[[Window], None],
    on_token: Callable[[], None] = lambda: None,
) -> Transcript:
    """Transcribe `request.audio` with `model` (mlx-audio's Whisper), window by window.

    `check` is called before each window and each decoder step, and may raise to end it
    there; `emit` gets each window's segments and text as the window ends; `on_token` is
    called per decoder step (statistics)."""
    check()
    mel = log_mel_spectrogram(mx.array(request.audio), n_mels=model.dims.n_mels, padding=N_SAMPLES)
    content_frames = mel.shape[-2] - N_FRAMES
    language = request.language
    if language is None:
        language = "en" if not model.is_multilingual else detect_language(model, mel)
    tokenizer = model.get_tokenizer(language=language, task=request.task)
    decoder = _WindowDecoder(model, request, language, tokenizer, check, on_token)

    input_stride = N_FRAMES // model.dims.n_audio_ctx  # mel frames per output token: 2
    time_precision = input_stride * HOP_LENGTH / SAMPLE_RATE  # seconds per output token
    all_tokens: list[int] = []
    initial: list[int] = []
    if request.prompt:
        initial = tokenizer.encode(" " + request.prompt.strip())
        all_tokens.extend(initial)
    prompt_reset_since = 0
    segments: list[Segment] = []
    sent = ""
    windows = 0
    last_speech_timestamp = 0.0
    seek = 0
    while seek < content_frames:
        check()
        time_offset = float(seek * HOP_LENGTH / SAMPLE_RATE)
        segment_size = min(N_FRAMES, content_frames - seek)
        mel_segment = pad_or_trim(mel[seek : seek + segment_size], N_FRAMES, axis=-2)
        mel_segment = mel_segment.astype(model.dtype)
        result = decoder.decode(mel_segment, all_tokens[prompt_reset_since:])
        windows += 1
        tokens = np.array(result.tokens)
        if result.no_speech_prob > NO_SPEECH_THRESHOLD and not (
            result.avg_logprob > LOGPROB_THRESHOLD
        ):
            seek += segment_size  # silence: on to the next window
            continue

        current: list[dict[str, Any]] = []

        def new_segment(
            start: float,
            end: float,
            piece: Any,
            result: Any = result,
            seek: int = seek,
            current: list[dict[str, Any]] = current,
        ) -> None:
            piece_tokens = piece.tolist()
            text_tokens = [t for t in piece_tokens if t < tokenizer.eot]
            current.append(
                {
                    "seek": seek,
                    "start": float(start),
                    "end": float(end),
                    "text": tokenizer.decode(text_tokens),
                    "tokens": piece_tokens,
                    "temperature": result.temperature,
                    "avg_logprob": result.avg_logprob,
                    "compression_ratio": result.compression_ratio,
                    "no_speech_prob": result.no_speech_prob,
                }
            )

        timestamp_tokens = tokens >= tokenizer.timestamp_begin
        single_timestamp_ending = timestamp_tokens[-2:].tolist() == [False, True]
        consecutive = np.where(np.logical_and(timestamp_tokens[:-1], timestamp_tokens[1:]))[0]
        consecutive += 1
        if len(consecutive) > 0:
            slices = consecutive.tolist()
            if single_timestamp_ending:
                slices.append(len(tokens))
            last_slice = 0
            for current_slice in slices:
                sliced = tokens[last_slice:current_slice]
                start_pos = sliced[0].item() - tokenizer.timestamp_begin
                end_pos = sliced[-1].item() - tokenizer.timestamp_begin
                new_segment(
                    time_offset + start_pos * time_precision,
                    time_offset + end_pos * time_precision,
                    sliced,
                )
                last_slice = current_slice
            if single_timestamp_ending:
                seek += segment_size
            else:
                last_pos = tokens[last_slice - 1].item() - tokenizer.timestamp_begin
                seek += last_pos * input_stride
        else:
            duration = segment_size * HOP_LENGTH / SAMPLE_RATE
            timestamps = tokens[timestamp_tokens.nonzero()[0]]
            if len(timestamps) > 0 and timestamps[-1].item() != tokenizer.timestamp_begin:
                duration = (timestamps[-1].item() - tokenizer.timestamp_begin) * time_precision
            new_segment(time_offset, time_offset + duration, tokens)
            seek += segment_size

        if request.word_timestamps:
            check()
            add_word_timestamps(
                segments=current,
                model=model,
                tokenizer=tokenizer,
                mel=mel_segment,
                num_frames=segment_size,
                last_speech_timestamp=last_speech_timestamp,
            )
            if not single_timestamp_ending:
                last_word_end = _last_word_end(current)
                if last_word_end is not None and last_word_end > time_offset:
                    seek = round(last_word_end * FRAMES_PER_SECOND)
            last_word_end = _last_word_end(current)
            if last_word_end is not None:
                last_speech_timestamp = last_word_end

        for segment in current:  # an instantaneous or empty segment keeps no text
            if segment["start"] == segment["end"] or segment["text"].strip() == "":
                segment["text"], segment["tokens"], segment["words"] = "", [], []
            _within(segment, request.duration)  # what it says stays (mlx-audio's text)
        made = tuple(_segment(len(segments) + i, s) for i, s in enumerate(current))
        segments.extend(made)
        all_tokens.extend(t for s in current for t in s["tokens"])
        if result.temperature > 0.5:  # a high temperature's text does not prompt the next
            prompt_reset_since = len(all_tokens)
        text = tokenizer.decode(all_tokens[len(initial) :])
        # A character cut between windows decodes as U+FFFD until its last byte arrives.
        ready = text.rstrip("\ufffd") if seek < content_frames else text
        emit(Window(made, ready[len(sent) :] if ready.startswith(sent) else ""))
        sent = ready if ready.startswith(sent) else sent
    mx.clear_cache()
    text = tokenizer.decode(all_tokens[len(initial) :])
    return Transcript(text, language, request.duration, tuple(segments), windows)


class _WindowDecoder:
    """One window decoded with mlx-audio's `DecodingTask`, through the fallback ladder."""

    def __init__(
        self,
        model: Any,
        request: TranscriptionRequest,
        language: str,
        tokenizer: Any,
        check: Check,
        on_token: Callable[[], None],
    ) -> None:
        self._model = model
        self._request = request
        self._language = language
        self._eot = tokenizer.eot
        self._check = check
        self._on_token = on_token
        self._key = mx.random.key(request.seed)

    def decode(self, mel_segment: mx.array, prompt: list[int]) -> Any:
        result: Any = None
        for temperature in self._request.temperatures:
            options = DecodingOptions(
                task=self._request.task,
                language=self._language,
                temperature=temperature,
                sample_len=self._request.max_window_tokens,
                prompt=prompt,
                without_timestamps=False,
                fp16=self._model.dtype == mx.float16,
            )
            task = DecodingTask(self._model, options)
            # The two seams: the per-token call, and the sampler (see the module docstring).
            task.inference = _Inference(self._model, self._check, self._on_token)
            self._key, key = mx.random.split(self._key)
            task.decoder = _KeyedDecoder(temperature, self._eot, key)
            result = task.run(mel_segment[None])[0]
            if not _needs_fallback(result):
                break
        return result


def _needs_fallback(result: Any) -> bool:
    """mlx-audio's rule: too repetitive or too unlikely, unless the window is silence."""
    needs = (
        result.compression_ratio > COMPRESSION_RATIO_THRESHOLD
        or result.avg_logprob < LOGPROB_THRESHOLD
    )
    silence = result.no_speech_prob > NO_SPEECH_THRESHOLD and result.avg_logprob < LOGPROB_THRESHOLD
    return needs and not silence


def _within(segment: dict[str, Any], duration: float) -> None:
    """Times inside the audio: the last window is padded to 30 s, and a timestamp token may
    point into the padding (srt, vtt and segments past the audio's end otherwise)."""
    for timed in (segment, *segment.get("words", [])):
        timed["start"] = min(max(float(timed["start"]), 0.0), duration)
        timed["end"] = min(max(float(timed["end"]), timed["start"]), duration)


def _last_word_end(segments: list[dict[str, Any]]) -> float | None:
    words = [w for s in segments for w in s.get("words", [])]
    return float(words[-1]["end"]) if words else None


def _segment(index: int, raw: dict[str, Any]) -> Segment:
    return Segment(
        id=index,
        seek=int(raw["seek"]),
        start=float(raw["start"]),
        end=float(raw["end"]),
        text=str(raw["text"]),
        tokens=tuple(int(t) for t in raw["tokens"]),
        temperature=float(raw["temperature"]),
        avg_logprob=float(raw["avg_logprob"]),
        compression_ratio=float(raw["compression_ratio"]),
        no_speech_prob=float(raw["no_speech_prob"]),
        words=tuple(
            Word(str(w["word"]), float(w["start"]), float(w["end"]), float(w["probability"]))
            for w in raw.get("words", [])
        ),
    )


class _Inference(Inference):  # type: ignore[misc]
    """mlx-audio's decoder forward pass, after `check` (which may stop it)."""

    def __init__(self, model: Any, check: Check, on_token: Callable[[], None]) -> None:
        super().__init__(model)
        self._check = check
        self._on_token = on_token

    def logits(self, tokens: mx.array, audio_features: mx.array) -> mx.array:
        self._check()
        self._on_token()
        return super().logits(tokens, audio_features)  # type: ignore[no-any-return]


class _KeyedDecoder(GreedyDecoder):  # type: ignore[misc]
    """mlx-audio's `GreedyDecoder`, sampling from its own key above temperature 0."""

    def __init__(self, temperature: float, eot: int, key: mx.array) -> None:
        super().__init__(temperature, eot)
        self._key = key

    def update(
        self, tokens: mx.array, logits: mx.array, sum_logprobs: mx.array
    ) -> tuple[mx.array, mx.array, mx.array]:
        if self.temperature == 0:
            return super().update(tokens, logits, sum_logprobs)  # type: ignore[no-any-return]
        self._key, key = mx.random.split(self._key)
        next_tokens = mx.random.categorical(logits / self.temperature, key=key)
        # From here on, GreedyDecoder.update's own lines.
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        current = logprobs[mx.arange(logprobs.shape[0]), next_tokens]
        sum_logprobs += current * (tokens[:, -1] != self.eot)
        eot_mask = tokens[:, -1] == self.eot
        next_tokens = next_tokens * (1 - eot_mask) + self.eot * eot_mask
        tokens = mx.concatenate([tokens, next_tokens[:, None]], axis=-1)
        completed = mx.all(tokens[:, -1] == self.eot)
        return tokens, completed, sum_logprobs
