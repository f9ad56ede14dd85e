"""Replay speculative decoding's drafting control on a recorded greedy output.

A greedy stream's tokens do not depend on speculation, so how many steps a drafting policy
needs for them, and what those steps cost under a model of a step's cost, can be computed
without running the model again: record the built-in model's greedy answer to each of
`bench/speculative.py`'s workloads once (`--record`), then replay the engine's own
`NgramIndex` and `DraftControl` on it, step by step, under costs of the form
verify(k) = plain * (1 + fixed + per_draft * k), for several (fixed, per_draft) pairs. It
says what a change to the control does to the tokens a step gives and to the modeled
speed-up, in seconds on the CPU, where the real speed-up can only be measured on a GPU.
The cost model is not calibrated: on an H200 the one-stream code edit ran at 1.58-1.99x
where this replay, with costs of the kind measured there, gives less (docs/benchmarks.md):
compare policies with it, not backends.

Usage:
  python -P bench/draft_replay.py --record bench/results/draft-tokens.json
  python -P bench/draft_replay.py --tokens bench/results/draft-tokens.json [--most 8]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import attrs

from mlx_nursery.engine._drafting import DraftControl, NgramIndex, Speculation

COSTS = [(0.05, 0.01), (0.1, 0.02), (0.15, 0.05), (0.3, 0.03), (0.5, 0.05), (0.1, 0.7)]
"""(fixed, per draft) shares of a plain step: a host-bound GPU stream's verifies cost a
little more than a plain step; the last, a CPU's, where each position costs most of a step."""


@attrs.frozen
class ModeledCosts:
    """`DraftControl`'s costs, from the model rather than measured."""

    fixed: float
    per_draft: float
    plain_s: float | None = 1.0

    def step_seconds(self, drafts: int) -> float | None:
        return 1.0 if drafts <= 0 else 1.0 + self.fixed + self.per_draft * drafts

    def promising(self, most: int) -> bool:
        return True


@attrs.frozen
class Replay:
    steps: int
    verifies: int
    drafted: int
    accepted: int
    seconds: float


def replay(prompt: list[int], output: list[int], most: int, costs: ModeledCosts) -> Replay:
    """The control's steps over `output` (greedy: a verify keeps its drafts up to the first
    that differs from the output, and gives the next token besides)."""
    index = NgramIndex(Speculation(tokens=most), prompt)
    control = DraftControl(most, costs)
    done = steps = verifies = drafted = accepted = 0
    seconds = 0.0
    while done < len(output):
        wanted = control.drafts(recurring=index.recurs())  # as the lone stream asks
        drafts = index.draft(wanted) if wanted else []
        kept = 0
        while kept < len(drafts) and done + kept < len(output):
            if drafts[kept] != output[done + kept]:
                break
            kept += 1
        step = min(kept + 1, len(output) - done)
        cost = costs.step_seconds(len(drafts))
        assert cost is not None
        seconds += cost
        steps += 1
        if drafts:
            control.verified(len(drafts), kept)
            verifies, drafted, accepted = verifies + 1, drafted + len(drafts), accepted + kept
        index.extend(output[done : done + step])
        done += step
    return Replay(steps, verifies, drafted, accepted, seconds)


def _speculative() -> Any:
    """bench/speculative.py, whose workloads these are."""
    here = str(Path(__file__).parent)
    if here not in sys.path:
        sys.path.append(here)  # last: this folder's names shadow nothing
    import speculative

    return speculative


def record(out: Path, code_edit_tokens: int) -> None:
    """The built-in model's greedy answers to the speculative benchmark's workloads, as
    long as `bench/speculative.py --tokens N` makes them (the code edit at most
    `code_edit_tokens`, the chat in proportion, by the workloads' shares)."""
    import trio

    from mlx_nursery.engine import EngineConfig, GenerationRequest, SamplingParams, open_engine
    from mlx_nursery.models import release_mlx_streams
    from mlx_nursery.models.default import ensure_default_model

    workloads = _speculative().WORKLOADS

    async def run() -> dict[str, dict[str, list[int]]]:
        traces: dict[str, dict[str, list[int]]] = {}
        config = EngineConfig(Path(ensure_default_model()), warmup=False)
        async with open_engine(config) as engine:
            for name, (messages, share) in workloads.items():
                tokenizer: Any = engine.model.tokenizer  # mlx-lm's wrapper (untyped)
                prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
                most = round(code_edit_tokens * share / workloads["code-edit"][1])
                request = GenerationRequest(
                    prompt, max_tokens=most, sampling=SamplingParams(temperature=0.0)
                )
                tokens = []
                async with engine.generate(request) as stream:
                    async for event in stream:
                        if event.token_id is not None:
                            tokens.append(event.token_id)
                traces[name] = {"prompt": prompt, "output": tokens}
        return traces

    try:
        out.write_text(json.dumps(trio.run(run)))
    finally:
        release_mlx_streams()


def faithful_edit() -> list[int]:
    """The code edit's answer as a model that follows the instruction writes it (the
    built-in SmolLM2 does not: after a preamble and a few lines of the file it repeats
    itself), in the built-in model's tokens: the whole file, renamed, in one code block."""
    from transformers import AutoTokenizer

    from mlx_nursery.models.default import ensure_default_model

    code = _speculative().CODE
    text = "```python\n" + code.replace("merge_settings", "combine_settings") + "```"
    tokenizer: Any = AutoTokenizer.from_pretrained(str(ensure_default_model()))
    return list(tokenizer.encode(text, add_special_tokens=False))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--record", type=Path, help="record the greedy answers to this file")
    p.add_argument(
        "--record-tokens", type=int, default=400, help="the code edit's most tokens, recorded"
    )
    p.add_argument("--tokens", type=Path, help="replay the answers recorded in this file")
    p.add_argument("--most", type=int, default=8, help="the most drafts a step")
    p.add_argument(
        "--faithful",
        action="store_true",
        help="also replay the code edit a capable model writes: the file, renamed, whole",
    )
    args = p.parse_args()
    if args.record:
        record(args.record, args.record_tokens)
    if not args.tokens:
        return
    traces = json.loads(args.tokens.read_text())
    if args.faithful:
        traces["code-edit (faithful)"] = {
            "prompt": traces["code-edit"]["prompt"],
            "output": faithful_edit(),
        }
    for name, trace in traces.items():
        output = trace["output"]
        for fixed, per_draft in COSTS:
            run = replay(trace["prompt"], output, args.most, ModeledCosts(fixed, per_draft))
            kept = run.accepted / run.drafted if run.drafted else 0.0
            print(
                f"{name:10s} verify 1+{fixed}+{per_draft}k: {len(output) / run.steps:.2f} tokens"
                f" a step, x{len(output) / run.seconds:.2f} modeled; {run.verifies} verifies,"
                f" {run.drafted} drafted, {kept:.2f} kept"
            )


if __name__ == "__main__":
    main()
