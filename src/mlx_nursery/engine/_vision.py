"""Images in prompts, for vision-language models: preparing them (no MLX, any thread) and
starting a sequence whose prompt holds them (the engine thread).

A VLM's prompt goes through mlx-vlm once, from admission: its vision tower encodes the
images, and its language model prefills the prompt's embeddings (text and image features
merged) into an mlx-lm KV cache, a chunk per engine iteration. From there the sequence is
an ordinary text sequence: the batch (or the fast path) continues it from that cache, as
from a prefix-cache hit, and its decoding runs on mlx-lm's text model of the same weights.
Multimodal rotary positions (Qwen2-VL's M-RoPE) are shifted by the model's `rope_deltas`
while prefilling: rotary attention depends only on position differences, so the shifted
prefill is exact, and every later position is the cache's offset, which is what the text
model uses.

The prefill runs a chunk per engine iteration (`ImagePrefill`), so a cancel lands between
chunks. Not yet: images in the prefix cache (a prompt with images is neither looked up nor
kept: its placeholder ids are the same whatever the image).
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import mlx.core as mx
import numpy as np

from ..models import LoadedModel
from ._kv_quant import CacheFactory
from ._types import ImageInputs
from ._upstream import generation_stream, make_prompt_cache


class VisionProcessor:
    """A VLM's processor for the request side: prompt text and decoded images in, token ids
    (one placeholder per image token) and `ImageInputs` out. NumPy and the tokenizer only:
    call it on a worker thread. Thread-safe: its calls take turns (a lock), which also keeps
    the processor's working copies of images (resized, as floats) to one request's at once."""

    def __init__(self, processor: Any, image_token_id: int) -> None:
        self._processor = processor
        self._image_token_id = image_token_id
        self._lock = threading.Lock()

    def prepare(self, text: str, images: list[Any]) -> tuple[list[int], ImageInputs]:
        """Raises ValueError (and what the processor raises) for inputs it cannot take.
        Waits for another request's call to end."""
        with self._lock:
            out = self._processor(text=[text], images=images, return_tensors="np")
        ids = [int(t) for t in np.asarray(out["input_ids"])[0]]
        arrays = {
            key: np.asarray(value)
            for key, value in out.items()
            if key not in ("input_ids", "attention_mask")
        }
        image_tokens = sum(1 for t in ids if t == self._image_token_id)
        digests = tuple(_digest(image) for image in images)
        return ids, ImageInputs(arrays, image_tokens=image_tokens, digests=digests)

    def check_image(self, image: Any) -> None:
        """Run one image through the image processor alone: raises what `prepare` would
        raise for it (to name the image a failed `prepare` could not take)."""
        with self._lock:
            self._processor.image_processor(images=[image], return_tensors="np")


def _digest(image: Any) -> bytes:
    """An image's identity: its decoded pixels, size and mode (the same picture sent as PNG
    or as JPEG of other bytes is another image; the same bytes are the same image)."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{image.mode}:{image.size}".encode())
    digest.update(image.tobytes())
    return digest.digest()


def cache_key(prompt: list[int], images: ImageInputs, image_token_id: int) -> list[int] | None:
    """The prefix cache's key for an image prompt (or for one with its tokens so far): the
    prompt with each image's run of placeholder ids replaced by ids that name that image
    (negative: no text token has them). None when the runs and the images do not pair up."""
    key = list(prompt)
    runs = 0
    i = 0
    while i < len(key):
        if key[i] != image_token_id:
            i += 1
            continue
        if runs >= len(images.digests):
            return None
        name = -1 - int.from_bytes(images.digests[runs][:8], "big")
        j = i
        while j < len(key) and key[j] == image_token_id:
            key[j] = name
            j += 1
        runs += 1
        i = j
    return key if runs == len(images.digests) else None


def last_image_end(prompt: list[int], image_token_id: int) -> int:
    """The index just past the prompt's last image placeholder (0 if none)."""
    for i in range(len(prompt) - 1, -1, -1):
        if prompt[i] == image_token_id:
            return i + 1
    return 0


def vision_processor(model: LoadedModel) -> VisionProcessor | None:
    if model.vision is None:
        return None
    return VisionProcessor(model.vision.processor, int(model.config["image_token_id"]))


_thread = threading.local()


def encoder_stream() -> mx.Stream:
    """This thread's stream for vision towers: its own, not the decode steps'. mlx-vlm's
    encoders read small arrays back to the host as they build (`.item()`, `.tolist()`: grid
    sizes, window indices, rotary positions); on the stream the decode steps are queued on,
    each read would wait for them. Made on first use; released with the thread's others."""
    stream: mx.Stream | None = getattr(_thread, "stream", None)
    if stream is None:
        stream = _thread.stream = mx.new_stream(mx.default_device())
    return stream


class ImagePrefill:
    """An image prompt's prefill, a chunk at a time: the worker runs one chunk per loop
    iteration, beside the batch's decode step, so that a cancel lands between chunks and the
    running streams keep stepping. Engine thread only.

    Made with the images' encoding launched (the vision tower runs once, from here, on the
    thread's `encoder_stream`; nothing on the host waits for it: the chunks, on mlx-lm's
    generation stream as every step, wait for it on the device); each `step` prefills
    the next prompt tokens' embeddings, as many as the worker gives it, into a fresh mlx-lm
    cache of the text model; once `done`, `cache` holds all of `prompt` but its last token."""

    def __init__(
        self,
        model: LoadedModel,
        prompt: list[int],
        images: ImageInputs,
        make_cache: CacheFactory = make_prompt_cache,
    ) -> None:
        vision = model.vision
        if vision is None:
            raise ValueError("this model does not take images")
        arrays = {key: mx.array(value) for key, value in images.arrays.items()}
        pixels = arrays.pop("pixel_values")
        self._ids = mx.array([prompt])
        with mx.stream(encoder_stream()):
            features = vision.model.get_input_embeddings(self._ids, pixels, **arrays)
            self._embeddings = features.inputs_embeds
            positions = getattr(features, "position_ids", None)
            deltas = getattr(features, "rope_deltas", None)
            if positions is not None and deltas is not None:
                positions = positions - deltas
            self._positions = positions
            self._encoded = [self._embeddings, *([] if positions is None else [positions])]
            mx.async_eval(self._encoded)  # type: ignore[no-untyped-call]
        self._language = vision.model.language_model
        self.prompt = prompt
        self.cache: list[Any] = make_cache(model.model)
        self._next = 0

    @property
    def done(self) -> bool:
        return self._next >= len(self.prompt) - 1

    def wait_encoded(self) -> None:
        """Return once the images' encoding has run (at once after the first time): a chunk
        timed after it is timed alone."""
        mx.eval(self._encoded)

    def step(self, size: int, *, wait: bool) -> int:
        """Prefill the next chunk, of at most `size` tokens; return its tokens. Raises what
        the model raises (the caller fails this request alone). `wait`: return once the
        device has run it (to time it); else launched only, so that the decode step
        launched next queues behind it rather than behind the host's wait for it."""
        start, end = self._next, min(self._next + size, len(self.prompt) - 1)
        kwargs = (
            {} if self._positions is None else {"position_ids": self._positions[..., start:end]}
        )
        with mx.stream(generation_stream):
            self._language(
                self._ids[:, start:end],
                inputs_embeds=self._embeddings[:, start:end],
                cache=self.cache,
                **kwargs,
            )
            states = [c.state for c in self.cache]
            if wait:
                mx.eval(states)
            else:
                mx.async_eval(states)  # type: ignore[no-untyped-call]
        self._next = end
        return end - start
