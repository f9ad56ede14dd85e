"""The prefix cache as the engine thread uses it: fetch a sequence's cached prefix at
admission, from memory or else from disk, and store ended sequences' KV state, in memory and
on disk, after their final events are out.

Entries are shared only within a model and a request's cache key (the namespace), on disk
as in memory; an image prompt is known by its tokens with each image's placeholders named
by that image (`_vision.cache_key`), and a cached prefix serves it only if it covers every
image. The disk tier (`_disk_kv.py`) is read only where it holds a longer prefix than
memory does; its read runs on its own thread while the sequence waits (`_loading.py`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from .. import fault_points
from ..models import LoadedModel
from ._disk_entries import DiskCacheStats, DiskRead, HostKV
from ._disk_kv import DiskKV, Restoring
from ._prefix_cache import CacheHit, PrefixCache
from ._sequence import LiveSequence
from ._stepper import KVState
from ._vision import cache_key, last_image_end

log = logging.getLogger("mlx_nursery.engine")


class PrefixReuse:
    """One model's use of the prefix cache (`cache` None: none in memory; `disk` None: none
    on disk)."""

    def __init__(
        self,
        model: LoadedModel,
        cache: PrefixCache | None,
        disk: DiskKV | None = None,
        prefill_seconds_per_token: Callable[[], float | None] = lambda: None,
    ) -> None:
        self._model = model
        self.cache = cache
        self.disk = disk
        self._prefill_seconds_per_token = prefill_seconds_per_token
        """The engine's measured prefill cost (`ChunkSizer`): a read slower than the prefill
        it spares is skipped (`_disk_rates.py`)."""
        self._image_token = int(model.config["image_token_id"]) if model.vision else None
        """A vision model's image placeholder id (None: a text model)."""
        self._failed: set[tuple[str, str, str]] = set()
        """The failures seen (what failed, the error's type and message): one that recurs
        (the idle expiry polls every few seconds) logs its traceback once; the repeats are
        counted (`reuse_failures`) and logged at debug level, not a traceback per poll."""

    @property
    def keeps_state(self) -> bool:
        """Whether ended sequences' KV states are worth keeping (a tier would store them)."""
        return self.cache is not None or self.disk is not None

    def fetch(self, sequence: LiveSequence, prompt: list[int]) -> CacheHit | None:
        """A private copy of the longest usable cached prefix of `prompt` in memory, covering
        all of its images (None: none). Raises only at the fault seam (the caller's guard)."""
        if self.cache is None:
            return None
        key = self._cache_key(sequence, prompt)
        if key is None:
            return None
        if fault_points.ARMED:
            fault_points.reach("prefix_fetch", sequence.label)
        try:
            hit = self.cache.fetch(self._namespace(sequence), key)
        except Exception:  # noqa: BLE001 - logged; caching is an optimisation, the request prefills
            self._emptied("a lookup")
            return None
        if hit is not None and not all(
            getattr(c, "offset", hit.cached_tokens) == hit.cached_tokens for c in hit.cache
        ):
            self.cache.record_failure()  # stale or mismatched state: prefill from scratch
            return None
        if hit is not None and hit.cached_tokens < self._images_end(prompt):
            return None
        return hit

    def read_from_disk(
        self, sequence: LiveSequence, prompt: list[int], hit: CacheHit | None
    ) -> DiskRead | None:
        """A read, begun, of the file holding a longer prefix of `prompt` than `hit` (the
        memory tier's), covering every image (None: the disk holds none)."""
        if self.disk is None or sequence.request.adapter is not None:
            return None  # the disk tier keeps the base model's KV only (no adapter's)
        key = self._cache_key(sequence, prompt)
        if key is None:
            return None
        cached = hit.cached_tokens if hit is not None else 0
        better_than = max(cached, self._images_end(prompt) - 1)
        try:
            return self.disk.find(
                repr(sequence.request.cache_key),
                key,
                better_than=better_than,
                prefill_seconds_per_token=self._prefill_seconds_per_token(),
            )
        except Exception:  # caching is an optimisation, never a failure
            log.exception("could not look the prefix cache's disk tier up")
            return None

    def restorer(self, kv: HostKV) -> Restoring:
        assert self.disk is not None
        return self.disk.restorer(kv)

    def disk_hit(self, read: DiskRead, restoring: Restoring) -> None:
        """A prefix read from disk started a sequence (counted, and its rate measured)."""
        if self.disk is not None:
            self.disk.served(read, restoring)

    def record_failure(self) -> None:
        """A fetched state would not merge: the caller prefills afresh."""
        if self.cache is not None:
            self.cache.record_failure()

    def store(self, ended: list[tuple[LiveSequence, KVState]], step: int) -> None:
        """Keep ended sequences' KV states (caching is an optimisation, never a failure)."""
        for sequence, (cache, tokens) in ended:
            if not self.keeps_state or not cache or not tokens:
                continue
            key = self._cache_key(sequence, list(tokens))
            if key is None:
                continue
            if self.cache is not None:
                try:
                    self.cache.insert(self._namespace(sequence), key, list(cache))
                except Exception:  # noqa: BLE001 - logged; caching is an optimisation
                    self._emptied("a store")  # its index may be half-written
            if self.disk is not None and sequence.request.adapter is None:
                try:
                    self.disk.offer(repr(sequence.request.cache_key), key, list(cache), step)
                except Exception:  # caching is an optimisation, never a failure
                    log.exception("could not offer a prefix-cache entry to the disk tier")

    def expire(self) -> bool:
        """Drop the entries idle past the cache's TTL; whether any went."""
        if self.cache is None:
            return False
        try:
            return self.cache.evict_expired() > 0
        except Exception:  # noqa: BLE001 - logged; caching is an optimisation, never a failure
            self._emptied("its expiry")
            return True

    def _emptied(self, what: str) -> None:
        """The cache failed `what`: it is emptied, so that a broken index fails no later
        request, and the failure counted (`reuse_failures`)."""
        assert self.cache is not None
        error = sys.exc_info()[1]
        failure = (what, type(error).__name__, str(error))
        if failure in self._failed:
            log.debug("the prefix cache failed %s again; it is emptied", what)
        else:
            self._failed.add(failure)
            log.exception("the prefix cache failed %s; it is emptied", what)
        self.cache.clear()
        self.cache.record_failure()

    def hand_over(self, step: int, *, now: bool) -> None:
        """The disk writes offered before this step (all, if `now`) go to the writer."""
        if self.disk is not None:
            self.disk.hand_over(step, now=now)

    def disk_stats(self) -> DiskCacheStats | None:
        return self.disk.stats() if self.disk is not None else None

    def close(self) -> None:
        """Finish the disk tier's writes and stop its threads (at the engine's end)."""
        if self.disk is not None:
            self.disk.close()

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
