"""Helpers for driving the real engine in tests."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from mlx_nursery.engine import THREAD_NAME, Engine, GenerationRequest, SamplingParams, TokenEvent


@attrs.define
class Run:
    events: list[TokenEvent]

    @property
    def tokens(self) -> list[int]:
        return [e.token_id for e in self.events if e.token_id is not None]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events)

    @property
    def final(self) -> TokenEvent:
        return self.events[-1]


async def collect(engine: Engine, request: GenerationRequest) -> Run:
    async with engine.generate(request) as stream:
        return Run([event async for event in stream])


async def collect_all(engine: Engine, requests: list[GenerationRequest]) -> list[Run]:
    """Run `requests` concurrently; results in request order."""
    runs: list[Run | None] = [None] * len(requests)

    async def one(i: int) -> None:
        runs[i] = await collect(engine, requests[i])

    async with trio.open_nursery() as nursery:
        for i in range(len(requests)):
            nursery.start_soon(one, i)
    return [run for run in runs if run is not None]


def request(engine: Engine, text: str, **kwargs: Any) -> GenerationRequest:
    kwargs.setdefault("max_tokens", 24)
    kwargs.setdefault("sampling", SamplingParams(temperature=0.0))
    return GenerationRequest(engine.model.tokenizer.encode(text), **kwargs)


def engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


class CallSignal:
    """A logits processor that sets a Trio event from the engine thread on its n-th call."""

    def __init__(self, token: trio.lowlevel.TrioToken, after_calls: int) -> None:
        self.event = trio.Event()
        self.calls = 0
        self._token = token
        self._after = after_calls

    def arm(self, more_calls: int) -> None:
        """Fire `more_calls` calls from now instead (the engine thread keeps calling meanwhile)."""
        self._after = self.calls + more_calls

    def __call__(self, tokens: Any, logits: Any) -> Any:
        self.calls += 1
        if self.calls == self._after:
            trio.from_thread.run_sync(self.event.set, trio_token=self._token)
        return logits


class Gate:
    """A logits processor that holds the engine thread at its n-th call until `open()`: while
    it is shut no step runs, so what the Trio side does meanwhile (requests lined up, commands
    queued) reaches the engine together, between two known steps. `reached` is set (from the
    engine thread) when it shuts."""

    def __init__(self, token: trio.lowlevel.TrioToken, at_call: int) -> None:
        self.reached = trio.Event()
        self.calls = 0
        self._token = token
        self._at = at_call
        self._shut = False
        self._open = threading.Event()

    def arm(self, more_calls: int) -> None:
        """Shut `more_calls` calls from now instead (the engine thread keeps calling meanwhile:
        it shuts at the first call at or past that)."""
        self._at = self.calls + more_calls

    def open(self) -> None:
        self._open.set()

    def __call__(self, tokens: Any, logits: Any) -> Any:
        self.calls += 1
        if not self._shut and self.calls >= self._at:
            self._shut = True
            trio.from_thread.run_sync(self.reached.set, trio_token=self._token)
            if not self._open.wait(timeout=60):  # a bound for a broken test, not a wait
                raise RuntimeError("the gate was never opened")
        return logits


def raising_processor(after_calls: int, exc: Callable[[], BaseException]) -> Any:
    calls = 0

    def processor(tokens: Any, logits: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls >= after_calls:
            raise exc()
        return logits

    return processor


@attrs.frozen
class TextlessIds:
    """A model whose vocabulary has holes and whose embedding rows run past its tokenizer
    (`with_textless_ids`): ids the model can sample that have no text."""

    path: Path
    holes: tuple[int, ...]
    """Ids below the tokenizer's last that no token has."""
    last: int
    """The tokenizer's last id (it has text)."""
    padding: tuple[int, ...]
    """Ids past the tokenizer's last, below the model's embedding rows."""
    rows: int
    """The model's embedding rows: the first id out of range."""


def with_textless_ids(tiny: Path, out: Path) -> TextlessIds:
    """The tiny model, its tokenizer cut back: its last learned tokens (ids 2040 and up) are
    gone but for one near the end, so 2040-2042 are holes, 2043 has text, and 2044-2047 are
    rows past the tokenizer, as real checkpoints pad them. The weights are the tiny model's."""
    shutil.copytree(tiny, out)
    spec = json.loads((out / "tokenizer.json").read_text("utf-8"))
    model = spec["model"]
    by_id = {i: token for token, i in model["vocab"].items()}
    rows, first_gone, last = 2048, 2040, 2043
    gone = {by_id[i] for i in range(first_gone, rows)}
    # Later merges make the later ids: dropping a merge whose result is gone keeps BPE valid.
    model["merges"] = [m for m in model["merges"] if "".join(m) not in gone]
    model["vocab"] = {t: i for t, i in model["vocab"].items() if i < first_gone}
    model["vocab"][f"<filler_{last}>"] = last
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), "utf-8")
    return TextlessIds(
        out, tuple(range(first_gone, last)), last, tuple(range(last + 1, rows)), rows
    )


def small_mlx_lm_model(module: Any, seed: int, **overrides: Any) -> Any:
    """A two-layer model of an mlx-lm model module (`mlx_lm.models.llama`, ...), 32 wide,
    random weights drawn from `seed`: for tests of what a module's code computes."""
    import mlx.core as mx

    mx.random.seed(seed)
    args = module.ModelArgs(
        model_type=module.__name__.rsplit(".", 1)[-1],
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=64,
        **overrides,
    )
    built = module.Model(args)
    mx.eval(built.parameters())
    return built
