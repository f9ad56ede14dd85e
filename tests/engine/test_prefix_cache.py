"""Prefix KV cache: through the engine, and its eviction policies on real KV caches."""

from __future__ import annotations

import logging
from typing import Any

import attrs
import mlx.core as mx
import pytest
import trio
from mlx_lm.models.cache import KVCache

from mlx_nursery.engine import (
    Engine,
    EngineConfig,
    GenerationRequest,
    PrefixCache,
    SamplingParams,
    open_engine,
)
from tests.helpers import collect, request

SYSTEM = "You are a helpful assistant. " * 40
SEEDED = SamplingParams(
    temperature=1.0, seed=11
)  # reproducible, and richer than greedy on random weights


def prompt(engine: Engine, question: str) -> list[int]:
    return engine.model.tokenizer.encode(SYSTEM + question)


async def test_shared_prefix_is_reused_and_output_matches_a_cold_run(
    engine_config: EngineConfig,
) -> None:
    cold_config = EngineConfig(engine_config.model, prompt_cache_bytes=0)
    async with open_engine(cold_config) as cold_engine:
        question = prompt(cold_engine, "What is the capital of France?")
        cold = await collect(
            cold_engine,
            GenerationRequest(question, max_tokens=16, ignore_eos=True, sampling=SEEDED),
        )

    async with open_engine(engine_config) as engine:
        await collect(
            engine, GenerationRequest(prompt(engine, "hello?"), max_tokens=4, ignore_eos=True)
        )
        before = engine.statistics().worker
        warm = await collect(
            engine, GenerationRequest(question, max_tokens=16, ignore_eos=True, sampling=SEEDED)
        )
        after = engine.statistics().worker

    assert warm.tokens == cold.tokens
    assert len(set(cold.tokens)) > 3
    assert warm.final.usage is not None and cold.final.usage is not None
    assert cold.final.usage.cached_tokens == 0
    shared = len(engine.model.tokenizer.encode(SYSTEM))
    assert warm.final.usage.cached_tokens >= shared - 2
    assert before is not None and after is not None
    prefilled = after.prompt_tokens_processed - before.prompt_tokens_processed
    # prefill chunks cover the uncached prompt but its last token, which the first decode step runs
    assert prefilled == len(question) - warm.final.usage.cached_tokens - 1
    assert after.prefix_cache is not None and after.prefix_cache.hits >= 1


async def test_cache_key_namespaces_entries(engine: Engine) -> None:
    tokens = prompt(engine, "same prompt")
    first = await collect(engine, GenerationRequest(tokens, max_tokens=4, cache_key="tenant-a"))
    other = await collect(engine, GenerationRequest(tokens, max_tokens=4, cache_key="tenant-b"))
    again = await collect(engine, GenerationRequest(tokens, max_tokens=4, cache_key="tenant-a"))
    assert first.final.usage and first.final.usage.cached_tokens == 0
    assert other.final.usage and other.final.usage.cached_tokens == 0
    assert again.final.usage and again.final.usage.cached_tokens == len(tokens) - 1


async def test_a_failing_prefix_cache_fails_no_request_and_starts_afresh(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault inside the prefix cache (its index, here) costs its request the reuse, not
    the request: the prompt is prefilled, the cache is emptied (an index a failure may have
    left half-written fails nothing later) and fills again."""
    from mlx_nursery.engine._radix import PrefixTrie

    tokens = prompt(engine, "a cache that fails")
    await collect(engine, GenerationRequest(tokens, max_tokens=2))  # stored
    # The lookup fails first; that arms the store's failure, so that the entry of the first
    # request (stored after its final event, before the engine takes the next request)
    # is stored whole.
    failures = {"search": 1, "add": 0}
    search, add = PrefixTrie.search, PrefixTrie.add

    def failing(name: str, method: Any) -> Any:
        def call(self: Any, *args: Any) -> Any:
            if failures[name]:
                failures[name] -= 1
                failures["add"] += name == "search"
                raise RuntimeError(f"{name} broke")
            return method(self, *args)

        return call

    monkeypatch.setattr(PrefixTrie, "search", failing("search", search))
    monkeypatch.setattr(PrefixTrie, "add", failing("add", add))
    before = engine.statistics().worker
    looked_up = await collect(engine, GenerationRequest(tokens, max_tokens=2))
    stored = await collect(engine, GenerationRequest(tokens, max_tokens=2))
    again = await collect(engine, GenerationRequest(tokens, max_tokens=2))
    after = engine.statistics().worker
    assert failures == {"search": 0, "add": 0}
    for result in (looked_up, stored, again):
        assert result.final.error is None and len(result.tokens) == 2
    assert looked_up.final.usage and looked_up.final.usage.cached_tokens == 0
    assert stored.final.usage and stored.final.usage.cached_tokens == 0  # emptied
    assert again.final.usage and again.final.usage.cached_tokens == len(tokens) - 1
    assert before and after and before.prefix_cache and after.prefix_cache
    assert after.prefix_cache.reuse_failures == before.prefix_cache.reuse_failures + 2


async def test_a_failing_expiry_pass_leaves_the_engine_serving(
    engine_config: EngineConfig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine loop's idle-expiry pass (its first runs before any request) failing
    empties the cache; it does not end the loop, which every request of the model needs.
    A failure that recurs at every pass logs its traceback once and counts the rest."""

    def broken(self: PrefixCache) -> int:
        raise RuntimeError("expiry broke")

    monkeypatch.setattr(PrefixCache, "evict_expired", broken)
    # A pass every iteration: a TTL below any iteration's length (with a millisecond, a
    # request that arrived within it of the first pass, on a fast machine, saw none more).
    config = attrs.evolve(engine_config, prompt_cache_ttl=1e-9)
    with caplog.at_level(logging.WARNING, logger="mlx_nursery.engine"):
        async with open_engine(config) as fresh:
            result = await collect(
                fresh, GenerationRequest(prompt(fresh, "still here?"), max_tokens=3)
            )
            stats = fresh.statistics().worker
    assert result.final.error is None and len(result.tokens) == 3
    assert stats is not None and stats.prefix_cache is not None
    failures = stats.prefix_cache.reuse_failures
    assert failures >= 2
    expiry = [r for r in caplog.records if "its expiry" in r.getMessage()]
    assert len(expiry) == 1 and expiry[0].exc_info


async def test_a_cancelled_prefill_is_kept_for_the_retry(engine: Engine) -> None:
    tokens = prompt(engine, "retry me")
    async with engine.generate(GenerationRequest(tokens, max_tokens=50, ignore_eos=True)) as stream:
        async for _ in stream:
            break
    retry = await collect(engine, GenerationRequest(tokens, max_tokens=4))
    assert retry.final.usage is not None and retry.final.usage.cached_tokens == len(tokens) - 1


def kv(tokens: int, width: int = 8) -> list[KVCache]:
    cache = KVCache()
    keys = mx.ones((1, 2, tokens, width))
    cache.update_and_fetch(keys, keys)
    mx.eval(cache.state)
    return [cache]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_entries_cut_from_a_batch_hold_only_their_own_memory(
    engine_config: EngineConfig,
) -> None:
    """A sequence leaving the batch is cached as a lazy slice of the batch's KV arrays;
    kept unevaluated, each entry would hold every batch row's KV alive, outside the
    byte budget (on an H100 that ran an 8B model out of memory)."""
    config = EngineConfig(engine_config.model, max_concurrency=8, prompt_cache_bytes=1 << 30)
    async with open_engine(config) as engine:
        baseline = mx.get_active_memory()

        async def background(i: int, task_status: trio.TaskStatus[None]) -> None:
            long = request(engine, f"background stream {i} " * 20, max_tokens=1000, ignore_eos=True)
            async with engine.generate(long) as stream:
                async for _ in stream:
                    task_status.started()
                    await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            for i in range(7):
                await nursery.start(background, i)
            for trial in range(6):  # each joins the batch, then leaves it cancelled
                short = request(engine, f"trial {trial} " * 12, max_tokens=1000, ignore_eos=True)
                async with engine.generate(short) as stream:
                    async for event in stream:
                        if event.token_id is not None:
                            break
            nursery.cancel_scope.cancel()
        await collect(engine, request(engine, "after", max_tokens=1))  # detaches have run
        stats = engine.statistics().worker
        held = mx.get_active_memory() - baseline

    assert stats is not None and stats.prefix_cache is not None
    assert stats.prefix_cache.entries >= 13
    # Unevaluated, the entries held about 3x their size here (1.05x evaluated). The slack
    # leaves room for allocators that round buffers up (Metal pages) and small engine arrays.
    assert held <= 2 * stats.prefix_cache.nbytes, (held, stats.prefix_cache.nbytes)


def test_exact_longer_and_shorter_hits_leave_one_token_to_prefill() -> None:
    cache = PrefixCache(max_bytes=1 << 20)
    cache.insert("m", [1, 2, 3, 4], kv(4))
    exact = cache.fetch("m", [1, 2, 3, 4])
    assert exact is not None and exact.cached_tokens == 3 and exact.cache[0].offset == 3
    longer = cache.fetch("m", [1, 2, 9])
    assert longer is not None and longer.cached_tokens == 2 and longer.cache[0].offset == 2
    shorter = cache.fetch("m", [1, 2, 3, 4, 5, 6])
    assert shorter is not None and shorter.cached_tokens == 4
    assert cache.fetch("m", [7, 8]) is None
    assert cache.fetch("other-model", [1, 2, 3, 4]) is None
    # the stored entry was copied, never trimmed in place
    again = cache.fetch("m", [1, 2, 3, 4, 5])
    assert again is not None and again.cached_tokens == 4


def test_byte_budget_evicts_least_recently_used() -> None:
    one = sum(c.nbytes for c in kv(4))
    cache = PrefixCache(max_bytes=2 * one)
    cache.insert("m", [1, 1, 1, 1], kv(4))
    cache.insert("m", [2, 2, 2, 2], kv(4))
    assert cache.fetch("m", [1, 1, 1, 1, 9]) is not None  # refreshes [1...]
    cache.insert("m", [3, 3, 3, 3], kv(4))
    stats = cache.stats()
    assert stats.entries == 2 and stats.nbytes <= 2 * one and stats.evictions == 1
    assert cache.fetch("m", [2, 2, 2, 2, 9]) is None
    assert cache.fetch("m", [1, 1, 1, 1, 9]) is not None
    cache.insert("m", [4] * 40, kv(40))  # larger than the whole budget: never stored
    assert cache.stats().nbytes <= 2 * one


def test_idle_entries_expire_after_ttl() -> None:
    clock = FakeClock()
    cache = PrefixCache(max_bytes=1 << 20, ttl=10.0, clock=clock)
    cache.insert("m", [1, 2, 3], kv(3))
    cache.insert("m", [5, 6, 7], kv(3))
    clock.now = 8.0
    assert cache.fetch("m", [1, 2, 3, 4]) is not None
    clock.now = 12.0
    assert cache.evict_expired() == 1
    assert cache.fetch("m", [5, 6, 7, 8]) is None
    assert cache.fetch("m", [1, 2, 3, 4]) is not None
    assert cache.stats().entries == 1


def test_inserting_an_extension_drops_its_prefix_entries() -> None:
    cache = PrefixCache(max_bytes=1 << 20)
    cache.insert("m", [1, 2], kv(2))
    cache.insert("m", [1, 2, 3, 4], kv(4))
    stats = cache.stats()
    assert stats.entries == 1 and stats.nbytes == sum(c.nbytes for c in kv(4))


def test_the_trie_search_finds_what_mlx_lms_finds() -> None:
    """`PrefixTrie.search` answers as mlx-lm's `PromptTrie.search` (exact, shorter, the
    shared prefix), and its `longer` is a stored sequence past that prefix (any serves the
    same reuse; mlx-lm's is the shortest, found by walking everything stored below)."""
    import random

    from mlx_lm.models.cache import PromptTrie

    from mlx_nursery.engine._radix import PrefixTrie

    rng = random.Random(3)
    template = [1, 2, 3, 4]
    stored = [
        template + [rng.randrange(5, 9) for _ in range(rng.randint(1, 12))] for _ in range(30)
    ]
    ours: PrefixTrie[None] = PrefixTrie()
    theirs = PromptTrie()
    assert ours.search("m", [1, 2]).common_prefix == 0  # nothing stored in this namespace yet
    for tokens in stored:
        ours.add("m", tokens, None)
        theirs.add("m", tokens, None)
    prompts = [
        *stored[:5],  # exact
        *(s[: len(s) // 2 + 1] for s in stored[5:10]),  # prefixes of stored ones
        *(s + [rng.randrange(5, 9) for _ in range(3)] for s in stored[10:15]),  # extensions
        *(template + [rng.randrange(5, 9) for _ in range(8)] for _ in range(20)),
        [9, 9, 9],  # shares nothing
        [],
    ]
    stored_set = {tuple(s) for s in stored}
    for prompt in prompts:
        mine, upstream = ours.search("m", prompt), theirs.search("m", prompt)
        assert mine.exact == upstream.exact
        assert mine.shorter == upstream.shorter
        assert mine.common_prefix == upstream.common_prefix
        assert (mine.longer is None) == (upstream.longer is None)
        if mine.longer is not None:
            assert tuple(mine.longer) in stored_set
            assert mine.longer[: mine.common_prefix] == prompt[: mine.common_prefix]
            assert len(mine.longer) >= mine.common_prefix
            if len(upstream.longer) == upstream.common_prefix:  # the shared prefix is stored
                assert mine.longer == upstream.longer


def _shared_length(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_the_radix_trie_answers_as_the_stored_sequences_say_through_adds_and_removals() -> None:
    """The radix trie against the plain set of what is stored, through random adds,
    removals (which merge and prune its edges) and removals of prefixes, on sequences that
    share long runs and part deep inside them: every search's exact, shorter, longer and
    shared prefix, and the values stored with them."""
    import random

    from mlx_nursery.engine._radix import PrefixTrie

    rng = random.Random(7)
    template = list(range(100, 160))
    trie: PrefixTrie[int] = PrefixTrie()
    stored: dict[tuple[int, ...], int] = {}

    def sequence() -> list[int]:
        base = template[: rng.randint(0, len(template))] if rng.random() < 0.8 else []
        return base + [rng.randrange(3) for _ in range(rng.randint(0, 40))]

    for step in range(1500):
        roll = rng.random()
        if roll < 0.4:
            tokens = sequence() or [1]
            replaced = trie.add("m", tokens, step)
            assert replaced == stored.get(tuple(tokens))
            stored[tuple(tokens)] = step
        elif roll < 0.55 and stored:
            tokens = list(rng.choice(list(stored)))
            assert trie.pop("m", tokens) == stored.pop(tuple(tokens))
        elif roll < 0.6 and stored:
            tokens = list(rng.choice(list(stored)))
            popped = trie.pop_prefixes("m", tokens)
            expected = sorted(
                (len(s), v)
                for s, v in stored.items()
                if len(s) < len(tokens) and list(s) == tokens[: len(s)]
            )
            assert sorted(popped) == expected
            for length, _ in popped:
                del stored[tuple(tokens[:length])]
        else:
            if stored and rng.random() < 0.5:
                base = list(rng.choice(list(stored)))
                prompt = base[: rng.randint(0, len(base))] + [
                    rng.randrange(3) for _ in range(rng.randint(0, 5))
                ]
            else:
                prompt = sequence()
            found = trie.search("m", prompt)
            if tuple(prompt) in stored and prompt:
                assert found.exact == prompt and found.exact_value == stored[tuple(prompt)]
                continue
            assert found.exact is None
            shared = max((_shared_length(list(s), prompt) for s in stored), default=0)
            assert found.common_prefix == shared
            prefixes = [
                s for s in stored if 1 < len(s) <= len(prompt) and list(s) == prompt[: len(s)]
            ]
            longest = max(prefixes, key=len, default=None)
            assert found.shorter == (list(longest) if longest else None)
            assert found.shorter_value == (stored[longest] if longest else None)
            if shared == 0:
                assert found.longer is None
            else:
                assert found.longer is not None and tuple(found.longer) in stored
                assert found.longer[:shared] == prompt[:shared]
                assert found.longer_value == stored[tuple(found.longer)]
    assert stored  # the run ended with sequences stored: the walk covered a full trie


def test_a_conversation_that_grows_turn_by_turn_stays_one_edge() -> None:
    """Each agent turn's prompt extends the last and replaces its entry (`pop_prefixes`):
    the trie keeps one edge for the whole conversation, so a lookup walks no node per
    turn."""
    from mlx_nursery.engine._radix import PrefixTrie

    trie: PrefixTrie[int] = PrefixTrie()
    tokens: list[int] = []
    for turn in range(50):
        tokens = [*tokens, turn, turn + 1, turn + 2]
        trie.add("m", tokens, turn)
        assert [value for _, value in trie.pop_prefixes("m", tokens)] == (
            [turn - 1] if turn else []
        )
    ((label, node),) = trie._roots["m"].edges.values()
    assert label == tokens and node.has_value and node.value == 49 and not node.edges
    assert trie.search("m", tokens[:-1]).longer_value == 49
