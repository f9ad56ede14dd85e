"""Cancellation stops compute, returns the lane, and leaves nothing behind."""

from __future__ import annotations

import gc

import attrs
import pytest
import trio
import trio.testing

from mlx_nursery.engine import (
    Engine,
    EngineConfig,
    EngineOverloaded,
    EngineUnavailable,
    GenerationRequest,
    open_engine,
)
from mlx_nursery.generation import ClientTooSlow, Output, generate_text
from tests.helpers import CallSignal, collect, engine_threads, raising_processor, request
from tests.http_helpers import eventually


def assert_idle(engine: Engine) -> None:
    stats = engine.statistics()
    assert stats.lanes_borrowed == 0
    assert stats.queued == 0
    assert stats.worker is not None and stats.worker.active == 0
    assert stats.late_events == 0  # nothing was computed for a sequence after its confirmation


def long_request(
    engine: Engine, text: str = "count forever", **kwargs: object
) -> GenerationRequest:
    budget = engine.model.context_length - 64
    return request(engine, text, max_tokens=budget, ignore_eos=True, **kwargs)  # type: ignore[arg-type]


async def test_leaving_mid_decode_stops_the_sequence(engine: Engine) -> None:
    async with engine.generate(long_request(engine)) as stream:
        seen = []
        async for event in stream:
            seen.append(event)
            if len(seen) == 5:
                break
    assert len(seen) == 5
    # On leaving the block the engine has confirmed the sequence is out of the batch.
    assert_idle(engine)


async def test_cancelled_sequence_reports_cancelled_and_lane_returns(engine: Engine) -> None:
    events = []
    with trio.CancelScope() as scope:
        async with engine.generate(long_request(engine)) as stream:
            async for event in stream:
                events.append(event)
                if len(events) == 3:
                    scope.cancel()
    assert scope.cancelled_caught
    assert len(events) == 3 and not any(e.is_final for e in events)
    assert stream.steps_in_flight_at_cancel is not None
    assert_idle(engine)


async def test_statistics_count_each_cancel_with_its_latency_and_steps_in_flight(
    engine: Engine,
) -> None:
    """Cancels by leaving the block and by `stop()` (a stop string's way) are both counted;
    a stream that ends on its own is not a cancellation."""
    before = engine.statistics().cancellations
    assert before.confirmed == 0 and before.quantile(0.5) is None
    await collect(engine, request(engine, "ends on its own", max_tokens=3, ignore_eos=True))
    async with engine.generate(long_request(engine)) as stream:
        async for _ in stream:
            break
    async with engine.generate(long_request(engine)) as stream:
        async for event in stream:
            if not event.is_final:
                stream.stop()
    assert event.finish_reason == "cancelled"
    stats = engine.statistics().cancellations
    assert stats.confirmed == 2 == sum(stats.seconds_counts) == sum(stats.steps_in_flight)
    assert stats.seconds_total > 0
    # The engine stops a sequence before its next step: the step in flight at most.
    assert sum(stats.steps_in_flight[:2]) == 2
    assert stats.quantile(1.0) in (*stats.seconds_buckets, float("inf"))
    assert_idle(engine)


async def test_cancel_during_long_prefill_abandons_it(engine_config: EngineConfig) -> None:
    config = EngineConfig(engine_config.model, max_concurrency=2, prefill_step_size=16)
    async with open_engine(config) as engine:
        token = trio.lowlevel.current_trio_token()
        signal = CallSignal(token, after_calls=1 << 30)  # armed once the prefill is submitted
        decoder = long_request(engine, "keep decoding", logits_processors=[signal])
        words = ("the capital of France is Paris " * 200).strip()
        long_prompt = engine.model.tokenizer.encode(words)[:2000]
        prefill = GenerationRequest(long_prompt, max_tokens=8)
        prefill_events = []

        async with trio.open_nursery() as nursery:
            decode_scope = trio.CancelScope()

            async def decode() -> None:
                with decode_scope:
                    await collect(engine, decoder)

            async def prefill_then_cancel() -> None:
                with trio.CancelScope() as scope:
                    async with engine.generate(prefill) as stream:
                        # The decoder keeps stepping; four of its steps from now, at least one
                        # prefill chunk has run and the engine thread is between chunks.
                        signal.arm(4)
                        await signal.event.wait()
                        scope.cancel()
                        async for event in stream:
                            prefill_events.append(event)

            nursery.start_soon(decode)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(prefill_then_cancel)
            await signal.event.wait()
            await trio.testing.wait_all_tasks_blocked()
            processed = engine.statistics().worker.prompt_tokens_processed  # type: ignore[union-attr]
            decode_scope.cancel()
        assert prefill_events == []
        # Only a few 16-token chunks of the 2000-token prompt were ever computed.
        assert 16 <= processed < 200, processed
        assert_idle(engine)


async def test_cancel_while_queued_costs_no_compute(engine_config: EngineConfig) -> None:
    config = EngineConfig(engine_config.model, max_concurrency=1, max_queue=4)
    async with open_engine(config) as engine:
        async with engine.generate(long_request(engine)) as running:
            await running.__anext__()
            before = engine.statistics().worker
            queued_scope = trio.CancelScope()

            async def queued() -> None:
                with queued_scope:
                    await collect(engine, request(engine, "never runs"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(queued)
                await trio.testing.wait_all_tasks_blocked()
                assert engine.statistics().queued == 1
                queued_scope.cancel()
            assert queued_scope.cancelled_caught
            assert engine.statistics().queued == 0
            assert engine.statistics().lanes_borrowed == 1
            after = engine.statistics().worker
            assert before is not None and after is not None
            assert after.prompt_tokens_processed == before.prompt_tokens_processed
        assert_idle(engine)


async def test_deadline_expiry_frees_the_lane(engine: Engine) -> None:
    with trio.move_on_after(0.2) as scope:
        run = await collect(engine, long_request(engine))
        pytest.fail(f"a {len(run.tokens)}-token run should outlast its deadline")
    assert scope.cancelled_caught
    assert_idle(engine)
    after = await collect(engine, request(engine, "next request", max_tokens=4, ignore_eos=True))
    assert after.final.finish_reason == "length"


async def test_full_queue_refuses_at_once(engine_config: EngineConfig) -> None:
    config = EngineConfig(engine_config.model, max_concurrency=1, max_queue=1)
    async with open_engine(config) as engine:
        async with engine.generate(long_request(engine)) as running:
            await running.__anext__()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect, engine, request(engine, "waits"))
                await trio.testing.wait_all_tasks_blocked()
                with pytest.raises(EngineOverloaded):
                    async with engine.generate(request(engine, "refused")):
                        pass
                nursery.cancel_scope.cancel()
        assert_idle(engine)


async def test_a_cancel_in_the_batch_keeps_the_kv_state_and_spares_the_others(
    engine: Engine,
) -> None:
    """The cancel is confirmed before the sequence is detached from the batch; detaching
    must still keep its KV state for reuse and leave the other sequences' rows intact."""
    neighbour_alone = await collect(
        engine, request(engine, "a neighbour", max_tokens=40, ignore_eos=True)
    )
    prompt = "Nobody has cached this prompt yet; it is long enough to reuse."
    async with trio.open_nursery() as nursery:
        neighbour: list[list[int]] = []

        async def run_neighbour() -> None:
            neighbour.append(
                (
                    await collect(
                        engine, request(engine, "a neighbour", max_tokens=40, ignore_eos=True)
                    )
                ).tokens
            )

        nursery.start_soon(run_neighbour)
        seen: list[int] = []
        async with engine.generate(long_request(engine, prompt)) as stream:
            async for event in stream:
                if event.token_id is not None:
                    seen.append(event.token_id)
                if len(seen) == 3:
                    break
    assert neighbour == [neighbour_alone.tokens]
    again = await collect(engine, request(engine, prompt, max_tokens=3, ignore_eos=True))
    prompt_tokens = len(engine.model.tokenizer.encode(prompt))
    assert again.final.usage is not None and again.final.usage.cached_tokens == prompt_tokens - 1
    assert again.tokens == seen
    assert_idle(engine)


async def test_finished_and_cancelled_sequences_leave_no_device_memory(
    engine_config: EngineConfig,
) -> None:
    """KV caches and step outputs are freed once a sequence ends (prefix cache off, so
    nothing is kept on purpose). A KV cache here is 128 KB per 256 tokens."""
    import attrs
    import mlx.core as mx

    async with open_engine(attrs.evolve(engine_config, prompt_cache_bytes=0)) as engine:
        settle = request(engine, "settle", max_tokens=1)
        await collect(engine, request(engine, "warm up", max_tokens=300, ignore_eos=True))
        await collect(engine, settle)
        baseline = mx.get_active_memory()
        for i in range(3):
            await collect(engine, request(engine, f"grow {i}", max_tokens=600, ignore_eos=True))
            async with engine.generate(long_request(engine, f"cancelled {i}")) as stream:
                seen = 0
                async for _ in stream:
                    seen += 1
                    if seen == 300:
                        break
        await collect(engine, settle)
        grown = mx.get_active_memory() - baseline
    # At most one short sequence's KV (the one settling) may still be held at either reading.
    assert grown < 256 * 1024, f"{grown} bytes still held after six sequences ended"


async def test_consumer_that_stops_reading_is_cancelled_without_stalling_others(
    engine_config: EngineConfig,
) -> None:
    config = EngineConfig(engine_config.model, max_concurrency=2, max_buffered_events=4)
    async with open_engine(config) as engine:
        reference = await collect(engine, request(engine, "other", max_tokens=30, ignore_eos=True))
        async with engine.generate(long_request(engine)) as stalled:
            other = await collect(engine, request(engine, "other", max_tokens=30, ignore_eos=True))
            assert other.tokens == reference.tokens
            events = [event async for event in stalled]
        assert len(events) == 5  # four buffered tokens, then the synthesized final error
        assert events[-1].finish_reason == "error"
        assert "fell behind" in (events[-1].error or "")
        assert_idle(engine)


async def test_a_reader_far_behind_the_model_gets_every_token_and_frees_its_lane(
    engine_config: EngineConfig,
) -> None:
    """A reader slower than the model (a slow link) is not cut: its request's events wait
    for it, however far behind, while its lane goes back as soon as the sequence ends. More
    tokens than the bound this server once cut at (1,024), read only after the end."""
    async with open_engine(attrs.evolve(engine_config, max_concurrency=1)) as engine:
        tokens = 1100
        async with engine.generate(request(engine, "a", max_tokens=tokens, ignore_eos=True)) as s:
            await eventually(
                lambda: engine.statistics().lanes_borrowed == 0, "the sequence ended unread"
            )
            events = [event async for event in s]
        assert [e.finish_reason for e in events[-1:]] == ["length"]
        assert sum(e.token_id is not None for e in events) == tokens
        assert all(e.error is None for e in events)
        assert_idle(engine)


async def test_a_stalled_consumer_is_the_clients_doing_above_the_engine(
    engine_config: EngineConfig,
) -> None:
    """The API layer's generation ends a stream whose reader stopped with `ClientTooSlow` (a
    client-class error, counted as a client cancel), not as an engine failure."""
    config = EngineConfig(engine_config.model, max_concurrency=1, max_buffered_events=4)
    async with open_engine(config) as engine:
        send, receive = trio.open_memory_channel[Output](0)
        raised: list[BaseException] = []

        async def generate(task_status: trio.TaskStatus[None]) -> None:
            async with send:
                try:
                    await generate_text(
                        engine, long_request(engine), (), send, task_status=task_status
                    )
                except ClientTooSlow as exc:
                    raised.append(exc)

        async with trio.open_nursery() as nursery:
            await nursery.start(generate)  # then nobody reads: the engine's buffer fills
            await eventually(lambda: engine.statistics().lanes_borrowed == 0, "stall cancel")
            outputs = [output async for output in receive]
        (error,) = raised
        assert error.code == "client_too_slow" and error.status == 408
        assert 1 <= len(outputs) <= 6  # what was buffered before the stall
        assert_idle(engine)


async def test_shutdown_cancels_in_flight_and_joins_the_thread(engine_config: EngineConfig) -> None:
    events = []
    async with open_engine(engine_config) as engine:
        assert len(engine_threads()) == 1
        async with engine.generate(long_request(engine)) as stream:
            async for event in stream:
                events.append(event)
                if len(events) == 2:
                    engine.close()
        assert not engine.healthy
        with pytest.raises(EngineUnavailable):
            async with engine.generate(request(engine, "too late")):
                pass
    assert events[-1].finish_reason == "cancelled"
    assert engine.statistics().lanes_borrowed == 0
    assert engine_threads() == []


class Fatal(BaseException):
    """Escapes every per-request guard, like a bug in the engine loop would."""


async def test_fatal_error_marks_unhealthy_and_fails_waiters(engine_config: EngineConfig) -> None:
    config = EngineConfig(engine_config.model, max_concurrency=1, max_queue=4)
    async with open_engine(config) as engine:
        doomed = long_request(engine, logits_processors=[raising_processor(4, Fatal)])
        waiter_error: list[BaseException] = []

        async def waiter() -> None:
            try:
                await collect(engine, request(engine, "waiting"))
            except EngineUnavailable as exc:
                waiter_error.append(exc)

        async with trio.open_nursery() as nursery, engine.generate(doomed) as stream:
            nursery.start_soon(waiter)
            events = [event async for event in stream]
        assert events[-1].finish_reason == "error"
        assert len(waiter_error) == 1
        assert not engine.healthy
        assert engine.statistics().state == "failed"
        assert engine.statistics().lanes_borrowed == 0
    assert engine_threads() == []


async def test_no_engine_thread_outlives_the_engine(engine_config: EngineConfig) -> None:
    async with open_engine(engine_config) as engine:
        await collect(engine, request(engine, "hi", max_tokens=3))
    assert engine_threads() == []


async def test_the_startup_heap_is_frozen_while_the_engine_runs(
    engine_config: EngineConfig,
) -> None:
    """Full GC passes skip what existed once the model loaded; the engine undoes it on exit."""
    gc.unfreeze()
    async with open_engine(engine_config) as engine:
        assert gc.get_freeze_count() > 0
        await collect(engine, request(engine, "hi", max_tokens=3))
    assert gc.get_freeze_count() == 0


async def test_the_caller_acknowledges_every_end_it_sees(
    engine_config: EngineConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before detaching a removed sequence (GIL-heavy), the engine thread waits briefly for
    the caller to have seen its end. The wait is bounded, so a missing acknowledgement would
    only show as latency; count them instead: one per end a caller saw, however the
    request ended."""
    from mlx_nursery.engine import _worker

    seen = 0

    def count(worker: _worker.Worker) -> None:
        nonlocal seen
        seen += 1

    monkeypatch.setattr(_worker.Worker, "confirmation_seen", count)
    async with open_engine(engine_config) as engine:
        await collect(engine, request(engine, "runs to its end", max_tokens=3, ignore_eos=True))
        assert seen == 1  # the final event, read from the stream

        async with engine.generate(long_request(engine)) as stream:
            async for _ in stream:
                break  # leaving: generate() waits for the confirmation
        assert seen == 2

        async with engine.generate(long_request(engine)) as stream:
            async for event in stream:
                if not event.is_final:
                    stream.stop()  # as a stop string does: the final event still comes
        assert event.finish_reason == "cancelled"
        assert seen == 3
        assert_idle(engine)
