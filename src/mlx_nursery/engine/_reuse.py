"""The prefix cache as the engine thread uses it: fetch a sequence's cached prefix at
admission, store ended sequences' KV state after their final events are out.

Entries are shared only within a model and a request's cache key (the namespace); an image
prompt is known by its tokens with each image's placeholders named by that image
(`_vision.cache_key`), and a cached prefix serves it only if it covers every image.
"""

from __future__ import annotations

import logging

from .. import fault_points
from ..models import LoadedModel
from ._prefix_cache import CacheHit, PrefixCache
from ._sequence import LiveSequence
from ._stepper import KVState
from ._vision import cache_key, last_image_end

log = logging.getLogger("mlx_nursery.engine")


class PrefixReuse:
    """One model's use of the prefix cache (`cache` None: no prefix cache)."""

    def __init__(self, model: LoadedModel, cache: PrefixCache | None) -> None:
        self._model = model
        self.cache = cache
        self._image_token = int(model.config["image_token_id"]) if model.vision else None
        """A vision model's image placeholder id (None: a text model)."""

    def fetch(self, sequence: LiveSequence, prompt: list[int]) -> CacheHit | None:
        """A private copy of the longest usable cached prefix of `prompt`, covering all of
        its images (None: none). Raises only at the fault seam (the caller's guard)."""
        if self.cache is None:
            return None
        key = self._cache_key(sequence, prompt)
        if key is None:
            return None
        if fault_points.ARMED:
            fault_points.reach("prefix_fetch", sequence.label)
        hit = self.cache.fetch(self._namespace(sequence), key)
        if hit is not None and not all(
            getattr(c, "offset", hit.cached_tokens) == hit.cached_tokens for c in hit.cache
        ):
            self.cache.record_failure()  # stale or mismatched state: prefill from scratch
            return None
        if hit is not None and hit.cached_tokens < self._images_end(prompt):
            return None
        return hit

    def record_failure(self) -> None:
        """A fetched state would not merge: the caller prefills afresh."""
        if self.cache is not None:
            self.cache.record_failure()

    def store(self, ended: list[tuple[LiveSequence, KVState]]) -> None:
        """Keep ended sequences' KV states (caching is an optimisation, never a failure)."""
        for sequence, (cache, tokens) in ended:
            if self.cache is None or not cache or not tokens:
                continue
            key = self._cache_key(sequence, list(tokens))
            if key is None:
                continue
            try:
                self.cache.insert(self._namespace(sequence), key, list(cache))
            except Exception:  # caching is an optimisation, never a failure
                log.exception("could not store a prefix-cache entry")

    def _namespace(self, sequence: LiveSequence) -> tuple[str, str | None, int]:
        """The KV of another adapter (or another load of one) is never reused: it differs.
        An adapter not loaded (-1) neither stores nor fetches (`_cache_key`)."""
        adapter, bank = sequence.request.adapter, self._model.adapters
        load = bank.load_id(adapter) if adapter is not None and bank is not None else 0
        return (str(self._model.path), sequence.request.cache_key, load)

    def _cache_key(self, sequence: LiveSequence, tokens: list[int]) -> list[int] | None:
        """What the prefix cache knows `tokens` of this sequence by (None: not cacheable)."""
        if self._namespace(sequence)[2] < 0:
            return None
        images = sequence.request.images
        if images is None or self._image_token is None:
            return tokens
        return cache_key(tokens, images, self._image_token)

    def _images_end(self, prompt: list[int]) -> int:
        """Where a prompt's images end: a cached prefix must reach it (0 for a text model)."""
        return 0 if self._image_token is None else last_image_end(prompt, self._image_token)
