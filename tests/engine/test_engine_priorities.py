"""Priorities on the real engine (`GenerationRequest.priority`; decisions/0044): a better
arrival is admitted before earlier waiting ones, and takes the lane or the KV memory of a
worse running one, which resumes later and gives exactly the tokens it gives alone.

Each scene is set with a `Gate` (the engine thread held between two known steps while the
requests line up), and every order asserted is one of admissions, never of time.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import trio
import trio.testing

from mlx_nursery.engine import Engine, EngineConfig, GenerationRequest, WorkerStats, open_engine
from mlx_nursery.engine._ledger import Ledger
from mlx_nursery.engine._messages import Submit
from mlx_nursery.engine._outbox import Outbox
from mlx_nursery.engine._sequence import LiveSequence
from tests.helpers import Gate, Run, collect, request


class Scene:
    """Requests run in one nursery, recording when each got its lane and when it ended."""

    def __init__(self, engine: Engine, nursery: trio.Nursery) -> None:
        self.engine = engine
        self.nursery = nursery
        self.admitted: list[str] = []
        self.finished: list[str] = []
        self.runs: dict[str, Run] = {}

    async def start(self, name: str, generation: GenerationRequest) -> None:
        """Start `name`; return once it has a lane or waits for one."""

        async def run() -> None:
            async with self.engine.generate(generation) as stream:
                self.admitted.append(name)
                self.runs[name] = Run([event async for event in stream])
            self.finished.append(name)

        self.nursery.start_soon(run)
        await trio.testing.wait_all_tasks_blocked()


async def test_a_better_arrival_is_admitted_before_earlier_waiting_ones(tiny_model: Path) -> None:
    """Two lanes, both busy; two low requests wait, then a better one comes: it gets the
    first lane that frees (without preemption), and the lows follow in their order."""
    config = EngineConfig(
        tiny_model, max_concurrency=2, prefill_step_size=64, max_preemptions=0, warmup=False
    )
    async with open_engine(config) as engine, trio.open_nursery() as nursery:
        gate = Gate(trio.lowlevel.current_trio_token(), at_call=2)
        scene = Scene(engine, nursery)
        low = {"priority": 1, "ignore_eos": True}
        busy = request(engine, "Busy.", max_tokens=20, logits_processors=[gate], **low)
        await scene.start("busy", busy)
        await gate.reached.wait()
        await scene.start("longer", request(engine, "Busy longer.", max_tokens=60, **low))
        await scene.start("low-1", request(engine, "Low one.", max_tokens=4, **low))
        await scene.start("low-2", request(engine, "Low two.", max_tokens=4, **low))
        await scene.start("high", request(engine, "High.", max_tokens=4, priority=-1))
        assert engine.statistics().queued == 3
        gate.open()
    assert scene.admitted == ["busy", "longer", "high", "low-1", "low-2"]
    waits = engine.statistics().queue_waits
    assert (waits[1].count, waits[-1].count) == (4, 1)
    worker = engine.statistics().worker
    assert worker is not None and worker.priority_preemptions == {}


async def test_a_better_arrival_takes_a_lane_and_the_preempted_one_resumes_unchanged(
    tiny_model: Path,
) -> None:
    """Two lanes held by low requests; a better one arrives: the newest low gives up its lane
    (its KV kept in the prefix cache), the better one runs, and the low one resumes from the
    cache when a lane frees: every request gives exactly the tokens it gives alone."""
    config = EngineConfig(tiny_model, max_concurrency=2, prefill_step_size=64, warmup=False)
    async with open_engine(config) as engine:

        def requests(tag: str, gate: Gate | None = None) -> dict[str, GenerationRequest]:
            low = {"priority": 1, "ignore_eos": True}
            first = "The first low request runs long."
            second = "Then a second one joins it."
            gated = [gate] if gate else []
            return {
                "first": request(engine, first, max_tokens=120, cache_key=f"{tag}-1", **low),
                "second": request(
                    engine,
                    second,
                    max_tokens=30,
                    cache_key=f"{tag}-2",
                    logits_processors=gated,
                    **low,
                ),
                "high": request(
                    engine,
                    "An urgent one.",
                    max_tokens=8,
                    priority=-1,
                    ignore_eos=True,
                    cache_key=f"{tag}-3",
                ),
            }

        alone = {name: await collect(engine, r) for name, r in requests("alone").items()}
        before = engine.statistics().worker
        assert before is not None and before.prefix_cache is not None
        gate = Gate(trio.lowlevel.current_trio_token(), at_call=10)
        together = requests("together", gate)
        async with trio.open_nursery() as nursery:
            scene = Scene(engine, nursery)
            await scene.start("first", together["first"])
            await scene.start("second", together["second"])
            await gate.reached.wait()  # the second is 9 tokens in
            await scene.start("high", together["high"])
            gate.open()
        stats = engine.statistics()
    assert {name: run.tokens for name, run in scene.runs.items()} == {
        name: run.tokens for name, run in alone.items()
    }
    assert scene.finished[0] == "high"  # it did not wait for a low one to end
    assert stats.worker is not None and stats.worker.priority_preemptions == {1: 1}
    after = stats.worker.prefix_cache
    assert after is not None
    assert after.hits - before.prefix_cache.hits == 1  # the replay read its own KV back
    reused = after.reused_tokens - before.prefix_cache.reused_tokens
    assert reused > len(together["second"].prompt_tokens)  # tokens it generated too
    assert stats.lanes_borrowed == 0 and stats.suspended == 0


async def test_a_better_arrival_short_of_kv_memory_takes_a_worse_ones_place(
    tiny_model: Path,
) -> None:
    """A KV budget that takes one sequence at a time: a better arrival does not wait for the
    running low one, which is preempted (its lane kept) and replayed from its tokens after."""
    config = EngineConfig(
        tiny_model, max_concurrency=4, prompt_cache_bytes=0, kv_cache_bytes=512 * 512,
        warmup=False,
    )  # fmt: skip
    async with open_engine(config) as engine:
        low = request(engine, "A low request.", max_tokens=50, priority=1, ignore_eos=True)
        high = request(engine, "A better one.", max_tokens=20, ignore_eos=True)
        alone = {"low": await collect(engine, low), "high": await collect(engine, high)}
        gate = Gate(trio.lowlevel.current_trio_token(), at_call=5)
        async with trio.open_nursery() as nursery:
            scene = Scene(engine, nursery)
            gated = attrs.evolve(low, logits_processors=[gate])
            await scene.start("low", gated)
            await gate.reached.wait()
            await scene.start("high", high)
            gate.open()
        stats = engine.statistics()
    assert {name: run.tokens for name, run in scene.runs.items()} == {
        name: run.tokens for name, run in alone.items()
    }
    assert scene.finished == ["high", "low"]
    assert stats.worker is not None
    assert stats.worker.priority_preemptions == {1: 1}
    assert (stats.worker.held_for_memory, stats.worker.preemptions) == (0, 0)


def test_a_submission_waiting_for_kv_memory_gains_a_class_per_aging_better_starts() -> None:
    """The wait for KV memory ages as the wait for a lane does (`Ledger.rank`): held
    submissions go by class, and a low one passed by `aging` better ones is of their class,
    first in line among them."""
    ledger = Ledger(Outbox(lambda delivery: None, _no_stats), checking=True, aging=2)
    low = Submit(0, GenerationRequest((1, 2), 4, priority=1))
    highs = [Submit(i, GenerationRequest((1, 2), 4)) for i in (1, 2, 3, 4)]
    ledger.hold([low, *highs])
    assert [c.seq_id for c in ledger.held()] == [1, 2, 3, 4, 0]
    for command in highs[:2]:  # two better ones start (their prompts prefilled, say)
        sequence = LiveSequence(command.seq_id, command.request, None, [], frozenset(), [])
        ledger.activate(sequence, uid=command.seq_id)
    assert [c.seq_id for c in ledger.held()] == [0, 3, 4]


def _no_stats() -> WorkerStats:
    return WorkerStats(0, 0, 0, 0, 0, None)
