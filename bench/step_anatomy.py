"""Where a batched engine step's time goes, under arrivals: a probe, kept out of the engine.

Runs the real engine in this process under closed-loop clients (varied prompt and output
lengths, temperature sampling, EOS ignored, as `bench/serving.py` loads a server) and wraps
the engine thread's phases to time them:

  decode     the running batch's step (`GenerationBatch.next`: build, launch, read tokens)
  first      a prefilled group's first-token step (`GenerationBatch.__init__`)
  join       moving prefilled rows into the running batch (`GenerationBatch.extend`)
  leave      removing rows from a batch (`GenerationBatch.filter`, `PromptProcessingBatch
             .filter`/`split`, `BatchKVCache.filter`)
  extract    copying a finished row's KV out (`GenerationBatch.extract_cache`)
  chunk      launching a prefill chunk (`_schedule.launch_chunk`; a chunk in the decode
             step's forward, `_packed.py`: its padding and bookkeeping, the rest being
             the decode step's)
  admit      taking a request in (`Admission._admit`, the prefix cache's lookup included)
  solo build a lone sequence's step on the fast path (`SoloSequence._forward`: the model's
             graph built, and launched unless `--launch` times that apart)
  solo read  the fast path's wait for a token and its handling (`_take_in_flight`, less
             the next step's build nested in it)
  rest       the engine loop's other work (settling, posting, detokenizing)

`--launch` times MLX's `async_eval` apart ("launch": encoding the graph and launching its
kernels, and waiting where MLX's queue of work in flight is full) and its `eval` ("wait": the
host waiting for the device), out of whichever phase calls them, and names each after its
caller ("launch (decode)", "launch (chunk)", "wait (store)", ...), so that a step's Python
graph building, each phase's launching and the waits read separately (`--clients 1`: a lone
stream, the fast path). A token read with `tolist()` waits inside its phase, not here.

`--graph` also counts the primitives each phase hands MLX to evaluate (`mx.eval`,
`mx.async_eval`, from `mx.export_to_dot` of the first calls): on the CPU, a proxy for how many
kernels a GPU step launches.

`--no-prelude` has a lone stream's decode step's heads made ready as mlx-lm does (slices,
RoPE, the KV write) rather than by one kernel (`engine/_decode_prelude.py`);
`--prelude-batches` has a running batch's step take that kernel too. `--fused-norms` has
each residual add and the RMSNorm after it run as one kernel (`engine/_fused_norm.py`).

`--kv-writes copy` has the batch's KV updated as mlx-lm does (MLX copies a layer's buffer
whenever the step before still reads it) rather than in place (`engine/_kv_append.py`), for
an A/B of the two in one machine's runs.

Every run also samples memory every 2 s (`_memory_watch.py`: MLX's arrays and its cache of
freed buffers, and on CUDA the device's memory pool), reported under `memory.samples`.

`--mode host` times the host alone (MLX runs asynchronously: a phase's time is what the
engine thread spent in it, waits included). `--mode sync` synchronizes the device before and
after each phase, so each phase's time includes its device work: the step is serialized
(slower overall), but the split says what each phase costs the device. Exclusive times: a
phase nested in another is subtracted from it.

Usage:
  python -P bench/step_anatomy.py --preset tiny --clients 8 --duration 20
  python -P bench/step_anatomy.py --model /tmp/l8b --clients 32 --input-len 500:1000 \
      --output-len 64:192 --duration 40 --mode sync
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import trio
from mlx_lm.generate import GenerationBatch

from mlx_nursery.engine import (
    EngineConfig,
    GenerationRequest,
    SamplingParams,
    _decode_attention,
    _decode_prelude,
    _fused_norm,
    _kv_append,
    _memory,
    _own_kernels,
    open_engine,
)
from mlx_nursery.engine._solo_sequence import SoloSequence
from mlx_nursery.tools import make_model

sys.path.append(str(Path(__file__).parent))  # last: this folder's names shadow nothing
from _kernels import decode_block_fits
from _memory_watch import watch_memory
from _phases import Graphs, Phases, install
from _timeline import profile_kernels


def prompt(n: int, rng: random.Random, vocab: int) -> list[int]:
    return [rng.randrange(10, min(vocab, 4000)) for _ in range(n)]


async def run(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    phases = Phases(sync=False)
    install(phases, launch=args.launch)
    graphs = Graphs(phases, limit=args.graph)
    if args.graph:
        mx.eval = graphs.wrap(mx.eval)
        mx.async_eval = graphs.wrap(mx.async_eval)
    config = EngineConfig(
        model,
        max_concurrency=args.clients,
        max_queue=4 * args.clients,
        pack_chunks=args.pack_chunks,
        cuda_graphs=args.cuda_graphs,
        prefill_step_size=args.prefill_step_size,
    )
    results = {}
    async with open_engine(config) as engine:
        # The engine thread is the one that runs the steps: learn it from a first request
        # (a lone one runs on the fast path, several in a batch).
        seen: list[int] = []
        original, solo = GenerationBatch.next, SoloSequence.step

        def spy(self: Any) -> Any:
            if not seen:
                seen.append(threading.get_ident())
            return original(self)

        def solo_spy(self: SoloSequence) -> Any:
            if not seen:
                seen.append(threading.get_ident())
            return solo(self)

        GenerationBatch.next = spy
        SoloSequence.step = solo_spy  # type: ignore[method-assign]
        warm = [
            GenerationRequest(prompt(64, random.Random(i), vocab), max_tokens=8, ignore_eos=True)
            for i in range(2)
        ]
        async with trio.open_nursery() as nursery:
            for request in warm:

                async def drain(r: GenerationRequest = request) -> None:
                    async with engine.generate(r) as stream:
                        async for _ in stream:
                            pass

                nursery.start_soon(drain)
        GenerationBatch.next = original
        SoloSequence.step = solo  # type: ignore[method-assign]
        phases.thread = seen[0] if seen else None
        for mode in ("host", "sync") if args.mode == "both" else (args.mode,):
            phases.sync = mode == "sync"
            results[mode] = await measure(args, engine, phases, vocab)
    if args.graph:
        results["graphs"] = graphs.report()
    return results


async def measure(
    args: argparse.Namespace, engine: Any, phases: Phases, vocab: int
) -> dict[str, Any]:
    tokens = 0
    requests = 0
    first_token_s: list[float] = []
    shared = prompt(args.prefix_len, random.Random(-1), vocab)
    phases.seconds.clear()
    phases.calls.clear()
    if shared:  # the shared prompt cached first, as a server that served it before has it
        warm = GenerationRequest(shared + prompt(8, random.Random(-2), vocab), max_tokens=2)
        async with engine.generate(warm) as stream:
            async for _ in stream:
                pass
    stats0 = engine.statistics().worker
    print(f"measuring: {'sync' if phases.sync else 'host'}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    deadline = start + args.duration

    async def client(index: int) -> None:
        nonlocal tokens, requests
        rng = random.Random(index)
        while time.perf_counter() < deadline:
            request = GenerationRequest(
                shared + prompt(rng.randint(*args.input_len), rng, vocab),
                max_tokens=rng.randint(*args.output_len),
                sampling=SamplingParams(temperature=args.temperature, seed=rng.randrange(1 << 30)),
                ignore_eos=True,
            )
            sent = time.perf_counter()
            async with engine.generate(request) as stream:
                async for event in stream:
                    if sent:
                        first_token_s.append(time.perf_counter() - sent)
                        sent = 0.0
                    if event.usage is not None:
                        tokens += event.usage.completion_tokens
            requests += 1
        ended.append(time.perf_counter())

    ended: list[float] = []
    """When each client finished its last request: the run's wall time ends at the last."""
    kernels: dict[str, Any] = {}
    samples: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:
        for i in range(args.clients):
            nursery.start_soon(client, i)
        nursery.start_soon(watch_memory, args.duration, samples)
        if args.kernels and not phases.sync:
            nursery.start_soon(profile_kernels, args.duration, kernels, phases)
    wall = max(ended, default=time.perf_counter()) - start  # not the watchers' tails
    memory = {
        "active_gb": round(mx.get_active_memory() / 2**30, 2),
        "cache_gb": round(mx.get_cache_memory() / 2**30, 2),
        "peak_gb": round(mx.get_peak_memory() / 2**30, 2),
        "samples": samples,  # over the run, in GB of 1e9 bytes (`_memory_watch.py`)
    }
    stats1 = engine.statistics().worker
    steps = (stats1.steps if stats1 else 0) - (stats0.steps if stats0 else 0)
    timed = sum(phases.seconds.values())
    table = {
        name: {
            "seconds": round(seconds, 3),
            "share": round(seconds / wall, 3),
            "calls": phases.calls[name],
            "ms_per_step": round(1000 * seconds / max(steps, 1), 2),
        }
        for name, seconds in sorted(phases.seconds.items(), key=lambda kv: -kv[1])
    }
    table["rest"] = {
        "seconds": round(wall - timed, 3),
        "share": round((wall - timed) / wall, 3),
        "calls": 0,
        "ms_per_step": round(1000 * (wall - timed) / max(steps, 1), 2),
    }
    return {
        "mode": "sync" if phases.sync else "host",
        "wall_s": round(wall, 2),
        "requests": requests,
        "tokens": tokens,
        "tok_per_s": round(tokens / wall, 1),
        "steps": steps,
        "ms_per_step": round(1000 * wall / max(steps, 1), 2),
        "ttft_ms_p50": round(1000 * statistics.median(first_token_s), 1) if first_token_s else None,
        "phases": table,
        "memory": memory,
        "kernels": kernels,
    }


def lengths(text: str) -> tuple[int, int]:
    low, _, high = text.partition(":")
    return int(low), int(high or low)


def _limit_buffer_cache(limit: int) -> None:
    """MLX's buffer cache held to `limit` bytes: set now (the CPU, Metal) and, on CUDA, as
    the share of the device the engine's start bounds it to (`_memory.bound_buffer_cache`),
    which would otherwise replace it."""
    mx.set_cache_limit(limit)
    memory = _memory.device_memory(mx.device_info())
    if memory:
        _memory.BUFFER_CACHE_FRACTION = limit / memory


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", type=Path)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--input-len", type=lengths, default=(100, 300))
    p.add_argument("--output-len", type=lengths, default=(64, 128))
    p.add_argument(
        "--prefix-len",
        type=int,
        default=0,
        help="tokens every request's prompt starts with (a shared system prompt)",
    )
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--duration", type=float, default=20)
    p.add_argument("--mode", choices=("host", "sync", "both"), default="both")
    p.add_argument("--kernels", action="store_true", help="CUDA kernel times (torch.profiler)")
    p.add_argument(
        "--launch", action="store_true", help="time MLX's async_eval apart (module docstring)"
    )
    p.add_argument(
        "--graph", type=int, default=0, metavar="N", help="count N evaluations' primitives a phase"
    )
    p.add_argument(
        "--cache-limit-gb",
        type=float,
        help="MLX's buffer cache limit (GiB), in place of the bound the engine sets on CUDA",
    )
    p.add_argument(
        "--pack-chunks",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="prefill chunks in the decode step's forward (EngineConfig.pack_chunks)",
    )
    p.add_argument(
        "--prefill-step-size",
        type=int,
        default=EngineConfig.__attrs_attrs__.prefill_step_size.default,
        help="the largest prefill chunk (EngineConfig.prefill_step_size; default: the"
        " backend's): fewer, larger chunks launch fewer kernels a prompt token",
    )
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="MLX's CUDA graphs on (EngineConfig.cuda_graphs; the engine's default is off)",
    )
    p.add_argument(
        "--kv-writes",
        choices=("engine", "copy"),
        default="engine",
        help="copy: the batch's KV updated as mlx-lm does, never in place (engine/_kv_append.py)",
    )
    p.add_argument(
        "--attention-threads",
        type=int,
        help="threads a block of the ragged decode attention (engine/_decode_attention.py)",
    )
    p.add_argument(
        "--attention-blocks",
        type=int,
        help="the ragged decode attention's target blocks (rows split into slices below it)",
    )
    p.add_argument(
        "--attention-vector-values",
        action="store_true",
        help="the ragged decode attention reads a key's values in one load a lane",
    )
    p.add_argument(
        "--mlx-compiles",
        action="store_true",
        help="the engine's CUDA kernels compiled by MLX, not its own NVRTC call (decisions/0057)",
    )
    p.add_argument(
        "--own-compiles",
        action="store_true",
        help="ours: every CUDA kernel compiled by the engine's NVRTC call where it can, the"
        " decode attention's too (MLX compiles it by default, decisions/0060)",
    )
    p.add_argument(
        "--no-prelude",
        action="store_true",
        help="a decode step's heads made ready as mlx-lm does, not by the one-kernel decode"
        " prelude (engine/_decode_prelude.py)",
    )
    p.add_argument(
        "--prelude-batches",
        action="store_true",
        help="the decode prelude in a running batch's step too (_decode_prelude.BATCHES)",
    )
    p.add_argument(
        "--fused-norms",
        action="store_true",
        help="each residual add and the RMSNorm after it in one kernel (_fused_norm.ENABLED)",
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if args.fused_norms:
        _fused_norm.ENABLED = True
    if args.no_prelude:
        _decode_prelude.ENABLED = False
    if args.prelude_batches:
        _decode_prelude.BATCHES = True
    if args.attention_threads:
        if not decode_block_fits(args.attention_threads):
            p.error("--attention-threads: a multiple of 32 from 32 to 512")
        _decode_attention._THREADS = args.attention_threads
        _decode_attention._WARPS = args.attention_threads // 32
    if args.attention_vector_values:
        _decode_attention._VECTOR_VALUES = True
    if args.attention_blocks:
        _decode_attention._TARGET_BLOCKS = args.attention_blocks
    if args.mlx_compiles:
        setattr(_own_kernels, "compiler", lambda: None)  # noqa: B010
    if args.own_compiles:
        _decode_attention.COMPILED_BY_MLX = False
    if args.cache_limit_gb is not None:
        _limit_buffer_cache(int(args.cache_limit_gb * 2**30))
    if args.kv_writes == "copy":
        setattr(_kv_append, "writes_in_place", lambda dtype, ordered=False: False)  # noqa: B010
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            model = Path(tmp) / args.preset
            make_model(model, preset=args.preset)
        result = trio.run(run, args, model)
    result = {
        "device": str(mx.default_device()),
        "args": {k: str(v) for k, v in vars(args).items()},
        **result,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
