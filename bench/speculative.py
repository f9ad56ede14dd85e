"""Speculative decoding by prompt lookup (`--speculative ngram`): decode rate, one stream or
several in one batch (`--streams`).

The built-in default model (SmolLM2-135M-Instruct), greedy, one stream on the fast path, two
workloads in its chat template:
  - code-edit: the prompt holds a file of code and asks for it back with one function
    renamed, so the answer repeats long spans of the prompt;
  - chat: a question whose answer repeats little of it.
Each variant is an engine of its own in this process: off, the adaptive default, and fixed
draft lengths (`adaptive=False`: every step drafts that many tokens when a draft is found),
which show what a verify step costs and gives on this backend. Each engine warms up as a
server's does (`--no-warmup` skips it). Rounds interleave the
variants, each request once per round. The decode rate is tokens after the first over the
time from the first to the last; the acceptance, drafted tokens accepted. Outputs must equal
the `off` variant's (greedy): a difference is reported.

`--model DIR` runs another model (a preset at real shapes on a GPU: random weights accept
few drafts, so this measures what speculation costs where it does not pay); `--draft-model
DIR` adds the draft-model variants (a smaller model with the same tokenizer). Several engines
share the device: give each a KV budget (`--kv-cache-bytes`) on a GPU.
`bench/agreeing_draft.py` makes a draft model that agrees with a random-weight target.

A peer, one stream only: `mlx-lm` and `mlx-lm draft` run mlx-lm's own decoding
(`stream_generate`, with `--draft-model` as its `draft_model`, 4 drafts a step as the fixed
variants) on the same prompts and models, greedy, timed alike and compared with `off`. The
peer loads the models with `mlx_lm.load`, as mlx_lm.server does: q/k/v and gate/up
projections unfused, where our engines fuse them (`EngineConfig.fuse_weights`), so
`mlx-lm` against `off` holds both the decode loop and the fusion, and `mlx-lm draft`
against `mlx-lm` is mlx-lm's own gain. mlx_lm.server with a draft model serves one request
at a time (it does not batch then), so there is no peer for `--streams N`.

With `--streams N` (N > 1) each request is sent N times at once, so the N streams decode
in one batch and each row verifies its own drafts in the batch's forward
(decisions/0049); the rate is the aggregate one: every stream's tokens after its first over
the time from the first stream's first token to the last stream's last.

`--temperature T` samples, seeded (`--seed`): drafts are accepted less than greedy, and the
outputs must still equal `off`'s (the same key draws each position with or without drafts).

Usage:
  python -P bench/speculative.py --rounds 2 --tokens 128 --out bench/results/spec-cpu.json
  python -P bench/speculative.py --streams 8 --rounds 1 --tokens 32 --variants off \
      "ngram (adaptive, 4)" "ngram fixed 4"
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import trio

from mlx_nursery.engine import (
    Engine,
    EngineConfig,
    GenerationRequest,
    SamplingParams,
    Speculation,
)
from mlx_nursery.models import release_mlx_streams
from mlx_nursery.models.default import ensure_default_model

sys.path.append(str(Path(__file__).parent))  # last: this folder's names shadow nothing
from _cost_trace import TRACE

CODE = '''import json
from pathlib import Path


def load_settings(path):
    """Read the settings file, or the defaults when it is missing."""
    file = Path(path)
    if not file.exists():
        return {"host": "127.0.0.1", "port": 8000, "debug": False}
    with file.open() as handle:
        return json.load(handle)


def save_settings(path, settings):
    with Path(path).open("w") as handle:
        json.dump(settings, handle, indent=2)


def merge_settings(base, overrides):
    merged = dict(base)
    for key, value in overrides.items():
        if value is not None:
            merged[key] = value
    return merged


def describe(settings):
    lines = []
    for key in sorted(settings):
        lines.append(f"{key} = {settings[key]}")
    return "\\n".join(lines)
'''

EDITOR = (
    "You are a code editor. Reply with the complete edited file in one Python code block,"
    " nothing else."
)
WORKLOADS: dict[str, tuple[list[dict[str, str]], float]] = {
    "code-edit": (
        [
            {"role": "system", "content": EDITOR},
            {
                "role": "user",
                "content": "Rename `merge_settings` to `combine_settings` in this file:\n\n"
                f"```python\n{CODE}```",
            },
        ],
        2.5,
    ),
    "chat": (
        [
            {
                "role": "user",
                "content": "Give me three tips for sleeping better, in a few sentences.",
            }
        ],
        1.0,
    ),
}
"""name -> (messages, the share of `--tokens` generated): the edit needs room to reach the
file's copy past the small model's preamble."""

VARIANTS: dict[str, Speculation | None] = {
    "off": None,
    "off (second engine)": None,
    "ngram (adaptive, 4)": Speculation(tokens=4),
    "ngram (adaptive, 8)": Speculation(tokens=8),
    "ngram fixed 2": Speculation(tokens=2, adaptive=False),
    "ngram fixed 4": Speculation(tokens=4, adaptive=False),
    "ngram fixed 8": Speculation(tokens=8, adaptive=False),
    "draft (adaptive, 4)": Speculation("draft", tokens=4, draft_model="(--draft-model)"),
    "draft fixed 4": Speculation("draft", tokens=4, draft_model="(--draft-model)", adaptive=False),
}
CONTROLS = {"off (second engine)"}
"""Variants that do not speculate beside `off`: a second engine like `off` in the same
process, which tells what a variant's engine being another one costs apart from drafting."""
DEFAULT_VARIANTS = [
    n
    for n, spec in VARIANTS.items()
    if n not in CONTROLS and (spec is None or spec.method == "ngram")
]
PEERS = {"mlx-lm": False, "mlx-lm draft": True}
"""name -> whether it drafts with `--draft-model` (mlx-lm's `num_draft_tokens`, PEER_DRAFTS)."""
PEER_DRAFTS = 4
Runner = Callable[[list[int], int], Awaitable[dict[str, Any]]]


def _variant(name: str, draft_model: Path | None) -> Speculation | None:
    spec = VARIANTS[name]
    if spec is None or spec.method == "ngram":
        return spec
    if draft_model is None:
        raise SystemExit(f"variant {name!r} needs --draft-model")
    return attrs.evolve(spec, draft_model=str(draft_model))


GREEDY = SamplingParams(temperature=0.0)


async def one(
    engine: Engine, prompt: list[int], tokens: int, sampling: SamplingParams = GREEDY
) -> dict[str, Any]:
    request = GenerationRequest(prompt, tokens, sampling)
    stamps: list[float] = []
    out: list[int] = []
    usage = None
    async with engine.generate(request) as stream:
        async for event in stream:
            if event.token_id is not None:
                stamps.append(time.perf_counter())
                out.append(event.token_id)
            if event.usage is not None:
                usage = event.usage
    assert usage is not None
    return _run(stamps, out, usage.draft_tokens, usage.accepted_draft_tokens)


def _run(stamps: list[float], out: list[int], drafted: int, accepted: int) -> dict[str, Any]:
    span = stamps[-1] - stamps[0] if len(stamps) > 1 else float("nan")
    return {
        "first": stamps[0],
        "last": stamps[-1],
        "tokens": out,
        "decode_tok_s": (len(stamps) - 1) / span,
        "drafted": drafted,
        "accepted": accepted,
    }


class MlxLmPeer:
    """mlx-lm's own generation (`PEERS`), run on this thread: it blocks the Trio loop while
    it generates, when no engine has work."""

    def __init__(self, model: Path, draft_model: Path | None) -> None:
        from mlx_lm import load

        self.model, self.tokenizer = load(str(model))
        self.draft = load(str(draft_model))[0] if draft_model is not None else None

    async def run(self, prompt: list[int], tokens: int, *, draft: bool) -> dict[str, Any]:
        from mlx_lm.generate import stream_generate

        extra = {"draft_model": self.draft, "num_draft_tokens": PEER_DRAFTS} if draft else {}
        stamps: list[float] = []
        out: list[int] = []
        drafted = accepted = 0
        new_round = True  # speculative_generate_step: accepted drafts, then the target's token
        responses = stream_generate(self.model, self.tokenizer, prompt, max_tokens=tokens, **extra)
        for response in responses:
            if response.finish_reason == "stop":
                break  # an EOS token: our engine does not emit it either
            stamps.append(time.perf_counter())
            out.append(response.token)
            if draft and new_round:
                drafted += min(tokens - len(out) + 1, PEER_DRAFTS)
            accepted += response.from_draft
            new_round = not response.from_draft
        return _run(stamps, out, drafted, accepted)


async def together(
    engine: Engine,
    prompt: list[int],
    tokens: int,
    sampling: SamplingParams = GREEDY,
    *,
    streams: int,
) -> dict[str, Any]:
    """`streams` copies of the request at once: one batch."""
    runs: list[dict[str, Any]] = []

    async def stream() -> None:
        runs.append(await one(engine, prompt, tokens, sampling))

    async with trio.open_nursery() as nursery:
        for _ in range(streams):
            nursery.start_soon(stream)
    first = min(r["first"] for r in runs)
    last = max(r["last"] for r in runs)
    return {
        "tokens": runs[0]["tokens"],
        "same_across_streams": all(r["tokens"] == runs[0]["tokens"] for r in runs),
        "decode_tok_s": sum(len(r["tokens"]) - 1 for r in runs) / (last - first),
        "drafted": sum(r["drafted"] for r in runs),
        "accepted": sum(r["accepted"] for r in runs),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    model = args.model or ensure_default_model()
    streams = args.streams
    base = EngineConfig(
        model,
        max_concurrency=streams,
        prompt_cache_bytes=0,
        kv_cache_bytes=args.kv_cache_bytes,
        warmup=args.warmup,
    )
    names = list(dict.fromkeys(args.variants or DEFAULT_VARIANTS))
    if "off" not in names:
        raise SystemExit("the variants must include 'off' (the reference)")
    peers = [name for name in names if name in PEERS]
    sampling = GREEDY
    if args.temperature > 0:
        if peers:
            raise SystemExit("the mlx-lm variants run greedy only")
        sampling = SamplingParams(temperature=args.temperature, seed=args.seed)
    if peers and streams > 1:
        raise SystemExit("the mlx-lm variants run one stream (see the module's docstring)")
    peer_drafts = any(PEERS[name] for name in peers)
    if peer_drafts and args.draft_model is None:
        raise SystemExit("variant 'mlx-lm draft' needs --draft-model")
    peer_draft = args.draft_model if peer_drafts else None
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        v: {w: [] for w in WORKLOADS} for v in names
    }
    async with trio.open_nursery() as nursery:
        runners: dict[str, Runner] = {}
        warmers: list[Runner] = []  # a lone request each, whatever --streams
        for name in (name for name in names if name in VARIANTS):
            config = attrs.evolve(base, speculation=_variant(name, args.draft_model))
            engine = await nursery.start(Engine(config).run)
            runner = one if streams == 1 else partial(together, streams=streams)
            runners[name] = partial(runner, engine, sampling=sampling)
            warmers.append(partial(one, engine))
            if name == "off":
                tokenizer: Any = engine.model.tokenizer
        if peers:
            peer = MlxLmPeer(model, peer_draft)
            for name in peers:
                runners[name] = partial(peer.run, draft=PEERS[name])
                warmers.append(runners[name])
        prompts = {
            w: list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
            for w, (messages, _) in WORKLOADS.items()
            if w in (args.workloads or WORKLOADS)
        }
        for warm in warmers:  # shapes and kernels, off the clock
            await warm(prompts["chat"], 8)
        for round_ in range(args.rounds):
            for workload, prompt in prompts.items():
                order = names if round_ % 2 == 0 else names[::-1]
                tokens = int(args.tokens * WORKLOADS[workload][1])
                for name in order:
                    # Traced by round: an engine's first round is where it learns.
                    TRACE.current = (workload, f"{name}, round {round_ + 1}")
                    run = await runners[name](prompt, tokens)
                    results[name][workload].append(run)
                    print(f"{workload} {name}: {run['decode_tok_s']:.2f} tok/s", flush=True)
        nursery.cancel_scope.cancel()
    return summarize(results, streams)


def summarize(
    results: dict[str, dict[str, list[dict[str, Any]]]], streams: int = 1
) -> dict[str, Any]:
    table = []
    for workload in (w for w in WORKLOADS if results["off"][w]):
        reference = results["off"][workload]
        off_rate = statistics.median(r["decode_tok_s"] for r in reference)
        for name, by_workload in results.items():
            runs = by_workload[workload]
            rate = statistics.median(r["decode_tok_s"] for r in runs)
            drafted = sum(r["drafted"] for r in runs)
            accepted = sum(r["accepted"] for r in runs)
            table.append(
                {
                    "workload": workload,
                    "variant": name,
                    "decode_tok_s": rate,
                    "ratio": rate / off_rate,
                    "rates": [r["decode_tok_s"] for r in runs],
                    "drafted": drafted,
                    "acceptance": accepted / drafted if drafted else None,
                    "same_output": all(
                        r["tokens"] == ref["tokens"] for r, ref in zip(runs, reference, strict=True)
                    ),
                    "tokens": len(runs[0]["tokens"]),
                    "same_across_streams": all(r.get("same_across_streams", True) for r in runs),
                }
            )
    return {"rows": table, "streams": streams}


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sample at this temperature, seeded (--seed), where drafts are accepted less "
        "than greedy (default: greedy); outputs must still equal off's",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="each engine warms up as a server's does (its verify steps included), so that "
        "kernels a shape builds on first use are not timed (--no-warmup: faster, on the CPU)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--streams", type=int, default=1, help="concurrent copies of each request (one batch)"
    )
    parser.add_argument(
        "--variants",
        nargs="*",
        choices=[*VARIANTS, *PEERS],
        help="default: off and every ngram one",
    )
    parser.add_argument("--workloads", nargs="*", choices=list(WORKLOADS), help="default: all")
    parser.add_argument(
        "--trace-costs",
        action="store_true",
        help="record what the control measured and chose (bench/_cost_trace.py)",
    )
    parser.add_argument("--model", type=Path, help="default: the built-in SmolLM2-135M")
    parser.add_argument("--draft-model", type=Path, help="for the draft variants")
    parser.add_argument(
        "--kv-cache-bytes",
        type=int,
        help="each engine's KV budget (several engines share one device here)",
    )
    args = parser.parse_args()
    # The engines' own log (their warm-up's phases, skipped ones included) on stderr: a
    # verify step that builds kernels in a timed round shows why.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("mlx_nursery.engine").setLevel(logging.INFO)
    if args.trace_costs:
        TRACE.install()
    try:
        report = trio.run(main, args)
    finally:
        release_mlx_streams()
    report.update(
        date=time.strftime("%Y-%m-%d"),
        commit=_commit(),
        machine=f"{platform.machine()} {platform.processor() or ''}".strip(),
        device=str(mx.default_device()),
        args={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    )
    if set(args.variants or ()) & set(PEERS):
        report["peer"] = {"loader": "mlx_lm.load (unfused)", "num_draft_tokens": PEER_DRAFTS}
    for row in report["rows"]:
        acceptance = "-" if row["acceptance"] is None else f"{row['acceptance']:.2f}"
        print(
            f"{row['workload']:10} {row['variant']:22} {row['decode_tok_s']:7.2f} tok/s"
            f"  x{row['ratio']:.2f}  drafted {row['drafted']:4}  acceptance {acceptance}"
            f"  same output {row['same_output']}"
        )
    if args.trace_costs:
        TRACE.print()
        report["trace"] = TRACE.summary()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
