"""A decode step and a prefill chunk in one forward (`engine/_packed.py`): the packed pass
computes what the two forwards computed, on both caches, and the batch generator that packs
gives the tokens mlx-lm's own generator gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.generate import BatchGenerator
from mlx_lm.models import gemma, llama, qwen2
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.utils import load

from mlx_nursery.engine import _packed
from mlx_nursery.engine._first_tokens import model_head
from mlx_nursery.engine._kv_quant import KVQuantization, cache_factory
from mlx_nursery.engine._messages import Submit
from mlx_nursery.engine._packed import packable
from mlx_nursery.engine._ragged import RaggedBatchKVCache, RowKVCache
from mlx_nursery.engine._schedule import ServingBatchGenerator
from mlx_nursery.engine._sequence import build_sequence
from mlx_nursery.engine._stepper import BatchStepper, Start
from mlx_nursery.engine._types import GenerationRequest, SamplingParams
from mlx_nursery.models._fusing import fuse_projections
from tests.helpers import small_mlx_lm_model


@pytest.fixture(scope="module")
def model(tiny_model: Path) -> Any:
    return load(str(tiny_model))[0]


def _small(module: Any, **overrides: Any) -> Any:
    return small_mlx_lm_model(module, 5, **overrides)


def _caches(model: Any) -> tuple[list[Any], list[Any]]:
    """The running batch's caches (three rows of different lengths, merged as the engine
    merges them) and the prompt batch's (two left-padded rows a chunk in), built the same way
    every call."""
    layers = len(model.model.layers)
    rows = []
    for length in (5, 9, 3):
        row = [RowKVCache() for _ in range(layers)]
        model(mx.array([[(3 * j + length) % 60 + 1 for j in range(length)]]), cache=row)
        rows.append(row)
    decode = [RaggedBatchKVCache.merge([row[i] for row in rows]) for i in range(layers)]
    prompt = [BatchKVCache(left_padding=[2, 0]) for _ in range(layers)]
    model.model(mx.array([[0, 0, 7, 8], [4, 5, 6, 7]]), cache=prompt)
    mx.eval([c.state for c in decode + prompt])
    return decode, prompt


@pytest.mark.parametrize("architecture", ["tiny qwen3", "tiny qwen3 fused", "llama", "qwen2"])
@pytest.mark.parametrize("padded", [False, True])
def test_the_packed_pass_computes_what_the_two_forwards_computed(
    model: Any, tiny_model: Path, architecture: str, padded: bool
) -> None:
    """Decode logits, the chunk's hidden states and both caches' contents after the pass
    equal those of the decode forward and the chunk forward run apart (float32); `padded`:
    a chunk whose rows differ in length, right-padded as a prompt batch's are."""
    if architecture == "tiny qwen3 fused":  # as the server loads it: one q/k/v matmul
        built = load(str(tiny_model))[0]
        assert fuse_projections(built).fused
    else:
        built = {
            "tiny qwen3": model,
            "llama": _small(llama, tie_word_embeddings=False),
            "qwen2": _small(qwen2),
        }[architecture]
    assert packable(built)
    assert _packed._reads(built.model.layers[0].self_attn)  # projections shared, not per part
    decode_inputs = mx.array([[11], [12], [13]])
    chunk_inputs = mx.array([[21, 22, 23, 24, 25], [31, 32, 33, 0, 0]])
    lengths = [5, 3] if padded else [5, 5]
    if not padded:
        chunk_inputs = mx.array([[21, 22, 23, 24, 25], [31, 32, 33, 34, 35]])

    def prepared(prompt: list[Any]) -> None:
        if padded:
            for cache in prompt:
                cache.prepare(lengths=lengths, right_padding=[5 - n for n in lengths])

    def finished(prompt: list[Any]) -> None:
        if padded:
            for cache in prompt:
                cache.finalize()

    decode, prompt = _caches(built)
    want_logits = built(decode_inputs, cache=decode)
    prepared(prompt)
    want_hidden = built.model(chunk_inputs, cache=prompt)
    finished(prompt)
    want_state = [c.state for c in decode + prompt]

    decode, prompt = _caches(built)
    prepared(prompt)
    head = model_head(built)
    assert head is not None
    forward = _packed.PackedForward(built, head, chunk_inputs, prompt)
    got_logits = forward(decode_inputs, cache=decode)
    finished(prompt)
    assert forward.chunk_hidden is not None
    got_state = [c.state for c in decode + prompt]

    assert got_logits.shape == want_logits.shape
    assert mx.allclose(got_logits, want_logits, atol=1e-4).item()
    for row, length in enumerate(lengths):  # padding positions are nobody's output
        got = forward.chunk_hidden[row, :length]
        assert mx.allclose(got, want_hidden[row, :length], atol=1e-4).item()
    for got, want in zip(got_state, want_state, strict=True):
        for got_part, want_part in zip(got, want, strict=True):
            if not isinstance(want_part, mx.array):  # a write index, an offset
                assert got_part == want_part
                continue
            assert got_part.shape == want_part.shape
            assert mx.allclose(got_part, want_part, atol=1e-4).item()


def test_only_the_architectures_read_are_packed() -> None:
    """A model type whose layers are not the body `_packed` reads (Gemma scales its
    embeddings and norms otherwise) runs its chunks apart."""
    assert not packable(_small(gemma, head_dim=8))

    class Other:
        args = type("Args", (), {"model_type": "gemma3n"})()

    assert not packable(Other())


@pytest.mark.parametrize(("count", "length", "step"), [(10, 20, 64), (9, 37, 8), (12, 5, 2)])
def test_a_packing_generator_gives_mlx_lms_tokens(
    model: Any, count: int, length: int, step: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy tokens of every sequence equal mlx-lm's own generator's and the generator's
    with chunks apart, while chunks of several right-padded rows ride in the decode steps
    (more prompts than the prompt batch holds, of mixed lengths, so later ones prefill
    beside decoding rows)."""
    chunks: list[tuple[int, int]] = []
    """(rows, length) of each packed chunk."""
    original = _packed.packed_body

    def recording(*args: Any) -> tuple[mx.array, mx.array]:
        chunks.append(tuple(args[3].shape))
        return original(*args)

    monkeypatch.setattr(_packed, "packed_body", recording)
    prompts = [[(7 * i + 3 * j) % 500 + 1 for j in range(length - i % 3)] for i in range(count)]

    def run(generator: BatchGenerator) -> dict[int, list[int]]:
        uids = generator.insert(prompts, max_tokens=[6 + i % 4 for i in range(count)])
        tokens: dict[int, list[int]] = {uid: [] for uid in uids}
        for _ in range(300):
            if all(len(tokens[uid]) == 6 + i % 4 for i, uid in enumerate(uids)):
                break
            for response in generator.next()[1]:
                tokens[response.uid].append(response.token)
        generator.close()
        return {uids.index(uid): t for uid, t in tokens.items()}

    settings: dict[str, Any] = {
        "completion_batch_size": 8,
        "prefill_batch_size": 4,
        "prefill_step_size": step,
    }
    packing = run(ServingBatchGenerator(model, pack_chunks=True, **settings))
    assert any(rows >= 2 for rows, _ in chunks), chunks  # several rows, padded, in a step
    assert packing == run(ServingBatchGenerator(model, pack_chunks=False, **settings))
    assert packing == run(BatchGenerator(model, **settings))


@pytest.mark.parametrize("kv_bits", [None, 8])
def test_the_engines_batch_gives_the_same_tokens_packed_or_apart(
    model: Any, small_model: Path, kv_bits: int | None
) -> None:
    """The engine's own batch stepper (its ragged running cache; 8-bit KV on the `small`
    preset, whose heads quantize in groups of 32): every sequence's greedy tokens are the
    same with chunks in the decode steps and apart."""
    quantization = None if kv_bits is None else KVQuantization(bits=kv_bits, group_size=32)
    if quantization is not None:
        model = load(str(small_model))[0]

    def run(pack: bool) -> dict[int, list[int]]:
        stepper = BatchStepper(
            model,
            max_concurrency=8,
            prefill_batch_size=4,
            prefill_step_size=8,
            make_cache=None if quantization is None else cache_factory(quantization),
            pack_chunks=pack,
        )
        by_uid: dict[int, int] = {}
        tokens: dict[int, list[int]] = {}
        for i in range(11):
            request = GenerationRequest(
                prompt_tokens=[(5 * i + 7 * j) % 300 + 2 for j in range(9 + 4 * (i % 5))],
                max_tokens=5 + i % 3,
                sampling=SamplingParams(temperature=0.0),
                ignore_eos=True,
            )
            start = Start(
                prompt=list(request.prompt_tokens),
                cache=None,
                cache_tokens=[],
                max_tokens=request.max_tokens,
            )
            uid = stepper.insert(build_sequence(Submit(i, request), frozenset()), start)
            by_uid[uid] = i
            tokens[i] = []
        try:
            for _ in range(300):
                if not by_uid:
                    break
                for response in stepper.step():
                    tokens[by_uid[response.uid]].append(int(response.token))
                    if response.finish_reason is not None:
                        del by_uid[response.uid]
        finally:
            stepper.close()
        assert not by_uid, "the stepper stopped making progress"
        return tokens

    assert run(True) == run(False)
