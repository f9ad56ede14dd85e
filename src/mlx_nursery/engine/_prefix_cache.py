"""Prefix KV cache: reuse the KV state of earlier sequences that share a prefix.

Built on our radix trie (`_radix.py`) for the token-prefix search and mlx-lm's
`trim_prompt_cache` / `can_trim_prompt_cache` for cutting a longer entry back to the shared
prefix, with the policies mlx-lm's `LRUPromptCache` lacks:
recency refreshed on every hit, a byte budget enforced on every insert, and an
idle TTL. Runs on the engine thread only (it holds MLX arrays); not thread-safe.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import attrs
import mlx.core as mx

from ._radix import PrefixTrie, TrieMatch
from ._upstream import can_trim_prompt_cache, trim_prompt_cache

log = logging.getLogger("mlx_nursery.engine")


@attrs.frozen(cache_hash=True)
class _Key:
    """An entry's namespace and tokens. Its hash is computed once: a key of tens of
    thousands of tokens is hashed again by every lookup, and by every step of an iteration
    over the entries (an `OrderedDict` looks each key up as it goes)."""

    namespace: Hashable
    tokens: tuple[int, ...]


@attrs.define
class _Entry:
    cache: list[Any]
    nbytes: int
    last_used: float


@attrs.frozen
class PrefixCacheStats:
    entries: int
    nbytes: int
    hits: int
    misses: int
    reused_tokens: int
    reuse_failures: int
    evictions: int
    too_large: int = 0
    """Entries not kept: larger than the whole byte bound (`prompt_cache_bytes`)."""


@attrs.frozen
class CacheHit:
    """A private copy of a cached KV state covering `prompt[:cached_tokens]`."""

    cache: list[Any]
    cached_tokens: int


class PrefixCache:
    def __init__(
        self,
        *,
        max_bytes: int,
        max_entries: int = 64,
        ttl: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.ttl = ttl
        self._clock = clock
        self._trie: PrefixTrie[_Key] = PrefixTrie()
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()  # least recently used first
        self._nbytes = 0
        self._hits = self._misses = self._reused = self._failures = self._evictions = 0
        self._too_large = 0

    def fetch(self, namespace: Hashable, prompt: list[int]) -> CacheHit | None:
        """Return the longest reusable prefix of `prompt`, leaving >= 1 token to prefill."""
        found = self._trie.search(namespace, prompt)
        hit = self._hit_from(prompt, found)
        if hit is None:
            self._misses += 1
            return None
        self._hits += 1
        self._reused += hit.cached_tokens
        return hit

    def _hit_from(self, prompt: list[int], found: TrieMatch[_Key]) -> CacheHit | None:
        if found.exact_value is not None:
            entry = self._touch(found.exact_value)
            if can_trim_prompt_cache(entry.cache) and len(prompt) > 1:
                return self._trimmed_copy(entry, len(prompt), len(prompt) - 1)
        shorter = len(found.shorter) if found.shorter is not None else 0
        if found.longer_value is not None and found.common_prefix > shorter:
            assert found.longer is not None
            entry = self._touch(found.longer_value)
            if can_trim_prompt_cache(entry.cache):
                keep = min(len(prompt) - 1, found.common_prefix)
                if keep > 0:
                    return self._trimmed_copy(entry, len(found.longer), keep)
        if found.shorter_value is not None and shorter > 0:
            entry = self._touch(found.shorter_value)
            return CacheHit(copy.deepcopy(entry.cache), shorter)
        return None

    @staticmethod
    def _trimmed_copy(entry: _Entry, length: int, keep: int) -> CacheHit:
        cache = copy.deepcopy(entry.cache)
        trim_prompt_cache(cache, length - keep)
        return CacheHit(cache, keep)

    def _touch(self, key: _Key) -> _Entry:
        entry = self._entries[key]
        entry.last_used = self._clock()
        self._entries.move_to_end(key)
        return entry

    def insert(self, namespace: Hashable, tokens: list[int], cache: list[Any]) -> None:
        """Keep `cache` (the KV state of exactly `tokens`), evicting to stay within budget."""
        nbytes = sum(c.nbytes for c in cache)
        if not tokens:
            return
        if nbytes > self.max_bytes:  # counted; said once, as it says the bound is too small
            self._too_large += 1
            if self._too_large == 1:
                log.warning(
                    "a prefix-cache entry of %d tokens (%d bytes) is larger than the prefix"
                    " cache's bound (%d bytes: --prompt-cache-bytes) and is not kept in"
                    " memory; such entries are counted (prefix_cache_too_large)",
                    len(tokens), nbytes, self.max_bytes,
                )  # fmt: skip
            return
        # A sequence cut from a batch arrives as lazy slices of the batch's KV arrays: until
        # evaluated, they keep every row's KV alive, outside the budget (on an H100 the
        # entries of one benchmark ran an 8B model out of memory). Copy out now; async, so
        # the step in flight is not waited for.
        mx.async_eval([c.state for c in cache])  # type: ignore[no-untyped-call]
        tokens = list(tokens)
        key = _Key(namespace, tuple(tokens))
        previous = self._trie.add(namespace, tokens, key)
        if previous is not None or key in self._entries:
            self._forget(key)
        self._entries[key] = _Entry(cache, nbytes, self._clock())
        self._nbytes += nbytes
        if can_trim_prompt_cache(cache):
            # A trimmable entry serves all its prefixes: drop them, they only take space.
            for _, shorter in self._trie.pop_prefixes(namespace, tokens):
                self._forget(shorter)
        while len(self._entries) > self.max_entries or self._nbytes > self.max_bytes:
            self._evict(next(iter(self._entries)))

    def record_failure(self) -> None:
        """A fetched state could not be used; the caller fell back to a full prefill."""
        self._failures += 1

    def evict_expired(self) -> int:
        deadline = self._clock() - self.ttl
        expired = [k for k, e in self._entries.items() if e.last_used <= deadline]
        for key in expired:
            self._evict(key)
        return len(expired)

    def clear(self) -> None:
        """Drop every entry without consulting the index (which a failure may have left
        inconsistent); counted as evictions."""
        self._evictions += len(self._entries)
        self._trie = PrefixTrie()
        self._entries.clear()
        self._nbytes = 0

    def _evict(self, key: _Key) -> None:
        self._trie.pop(key.namespace, list(key.tokens))
        self._forget(key)
        self._evictions += 1

    def _forget(self, key: _Key) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._nbytes -= entry.nbytes

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(
            entries=len(self._entries),
            nbytes=self._nbytes,
            hits=self._hits,
            misses=self._misses,
            reused_tokens=self._reused,
            reuse_failures=self._failures,
            evictions=self._evictions,
            too_large=self._too_large,
        )
