"""The engine's contract with mlx-lm and mlx-audio (`engine/_upstream.py`), against the
pinned versions: each private part the engine relies on exists and behaves as relied on,
so that an upgrade that breaks one fails here, by name.

Upstream functions the engine replaces or copies are asserted unchanged (by their syntax
tree): `BatchGenerator._next` (replaced by `_schedule.ServingBatchGenerator._next`),
`GenerationBatch._step` and `__init__` (`_first_tokens.FirstFromChunk` copies the step's
lines after the forward and reads the fields `__init__` sets), `GenerationBatch.next` and
`filter` (`_batch_speculating`'s verify step stands in for `next`), `GreedyDecoder.update`
(copied in `_whisper._KeyedDecoder`); when one changes, the engine's version must be
compared with the new one and the digest updated.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.utils import load

import mlx_nursery.engine as engine_package
from mlx_nursery.engine import _upstream
from mlx_nursery.engine._kv_quant import QuantizedBatchKVCache, QuantizedKVRow
from mlx_nursery.engine._schedule import ServingBatchGenerator

ENGINE = Path(engine_package.__file__).parent


def _signature(member: Any) -> inspect.Signature:
    function = member.fget if isinstance(member, property) else member
    return inspect.signature(getattr(function, "__func__", function))


def _shape(member: Any) -> list[tuple[Any, str | None, bool]]:
    """A callable's parameters as callers see them: kind, name where passed by name only,
    and whether each has a default (positional names may differ: callers pass by position)."""
    return [
        (p.kind, p.name if p.kind is p.KEYWORD_ONLY else None, p.default is not p.empty)
        for p in _signature(member).parameters.values()
    ]


def _member(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    raise AssertionError(f"{cls.__name__} has no {name}")


def _digest(function: Callable[..., Any]) -> str:
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]


def test_only_the_adapter_imports_mlx_lm_and_mlx_audio_or_reads_frames() -> None:
    offenders = []
    for path in sorted(ENGINE.glob("*.py")):
        if path.name == "_upstream.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            elif isinstance(node, ast.Attribute) and node.attr == "_getframe":
                names = ["sys._getframe"]
            if any(
                n.split(".")[0] in ("mlx_lm", "mlx_audio") or n == "sys._getframe" for n in names
            ):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


def test_every_name_the_adapter_exports_resolves() -> None:
    missing = [name for name in _upstream.__all__ if getattr(_upstream, name, None) is None]
    assert missing == []


def test_the_base_cache_has_the_members_our_batch_cache_overrides_with_their_shapes() -> None:
    assert QuantizedBatchKVCache.__mro__[1] is _upstream.BaseCache
    overridden = [
        name
        for name in QuantizedBatchKVCache.__dict__
        if not name.startswith("__") and hasattr(_upstream.BaseCache, name)
    ]
    assert sorted(overridden) == ["empty", "is_trimmable", "nbytes", "size", "state"]
    for name in overridden:
        theirs, ours = _member(_upstream.BaseCache, name), QuantizedBatchKVCache.__dict__[name]
        assert type(theirs) is type(ours), name  # a property stays a property
        assert _shape(theirs) == _shape(ours), name
    assert isinstance(_upstream.BaseCache.__dict__["state"], property)
    assert _upstream.BaseCache.__dict__["state"].fset is not None  # our setter overrides one


@pytest.mark.parametrize(
    "name",
    [
        "update_and_fetch",
        "prepare",
        "finalize",
        "state",
        "is_trimmable",
        "trim",
        "make_mask",
        "filter",
        "extend",
        "extract",
        "merge",
        "size",
        "empty",
        "nbytes",
    ],
)
def test_our_batch_cache_implements_each_batch_kv_cache_member_as_called(name: str) -> None:
    """`BatchGenerator` and the models call these on every batch cache; ours must take
    what they pass to mlx-lm's `BatchKVCache`."""
    theirs, ours = _member(BatchKVCache, name), _member(QuantizedBatchKVCache, name)
    assert type(theirs) is type(ours)
    assert _shape(theirs) == _shape(ours)


def test_a_quantized_row_is_made_and_merged_as_the_batch_expects() -> None:
    assert list(_signature(_upstream.QuantizedKVCache.__init__).parameters)[1:] == [
        "group_size",
        "bits",
    ]
    rows = [QuantizedKVRow(64, 8) for _ in range(2)]
    for row, length in zip(rows, (3, 5), strict=True):
        row.update_and_fetch(mx.ones((1, 2, length, 64)), mx.ones((1, 2, length, 64)))
    assert (rows[0].bits, rows[0].group_size, rows[0].offset) == (8, 64, 3)
    batch = type(rows[0]).merge(rows)  # what mlx-lm's batching calls on a row's class
    assert isinstance(batch, QuantizedBatchKVCache) and batch.size() == 5


def test_attention_dispatches_to_quantized_attention_on_a_cache_with_bits() -> None:
    """mlx-lm's attention reads `bits` and `group_size` off the cache: our quantized caches
    are used only through that."""

    class Quantized:
        bits, group_size = 8, 64

    queries, keys, values = (
        mx.random.normal((1, 2, 4, 64), key=mx.random.key(i)) for i in range(3)
    )
    packed_keys = mx.quantize(keys, group_size=64, bits=8)
    packed_values = mx.quantize(values, group_size=64, bits=8)
    expected = mx.fast.scaled_dot_product_attention(
        queries,
        mx.dequantize(*packed_keys, 64, 8),
        mx.dequantize(*packed_values, 64, 8),
        scale=0.125,
    )
    queries = queries + 0  # it scales its queries in place
    out = scaled_dot_product_attention(
        queries, packed_keys, packed_values, Quantized(), scale=0.125, mask=None
    )
    assert mx.allclose(out, expected, atol=1e-4).item()


def test_the_byte_decoder_maps_gpt2_characters_to_their_bytes() -> None:
    assert _upstream.byte_decoder is not None
    table = _upstream.byte_decoder()
    assert sorted(table.values()) == list(range(256))
    assert all(len(char) == 1 for char in table)
    assert all(table[chr(b)] == b for b in range(ord("!"), ord("~") + 1))
    assert (table["Ġ"], table["Ċ"], table["ĉ"]) == (32, 10, 9)


@pytest.fixture(scope="module")
def model(tiny_model: Path) -> Any:
    return load(str(tiny_model))[0]


def test_a_batched_sampler_reads_its_rows_from_the_generation_batch_that_calls_it(
    model: Any,
) -> None:
    """Each row draws the token its uid names: the rows are the uids, in order."""
    seen: list[list[int] | None] = []

    class Probe:
        def __call__(self, logprobs: mx.array) -> mx.array:
            rows = _upstream.sampler_rows()
            seen.append(rows)
            assert rows is not None and len(rows) == logprobs.shape[0]
            return mx.array([100 + uid for uid in rows])

    probe = Probe()
    generator = _upstream.BatchGenerator(model, completion_batch_size=4, prefill_step_size=64)
    uids = generator.insert([[5, 6, 7], [8, 9]], max_tokens=[2, 2], samplers=[probe, probe])
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    for _ in range(4):
        for response in generator.next()[1]:
            tokens[response.uid].append(int(response.token))
    generator.close()
    assert tokens == {uid: [100 + uid] * 2 for uid in uids}
    assert any(rows is not None and sorted(rows) == sorted(uids) for rows in seen)


def test_the_batch_generator_internals_our_schedule_replaces_and_reads(model: Any) -> None:
    assert _digest(_upstream.BatchGenerator._next) == "7fe0f37955dd9d8b"
    generator = ServingBatchGenerator(model, completion_batch_size=4, prefill_step_size=64)
    counters = generator._counters
    for field in ("prompt_tokens", "prompt_time", "decode_time", "generation_tokens"):
        assert isinstance(getattr(counters, field), int | float), field
    assert isinstance(counters.generation_steps, int)
    assert len(generator._generation_batch) == len(generator._prompt_batch) == 0
    assert list(generator._unprocessed_sequences) == generator._currently_processing == []
    assert list(_signature(generator._make_batch).parameters) == ["self", "n"]
    response = _upstream.PromptProcessingBatch.Response(1, (2, 3), True, False)
    assert (response.uid, response.progress, response.end_of_segment) == (1, (2, 3), True)
    assert response.end_of_prompt is False
    (uid,) = generator.insert([[5, 6, 7, 8]], max_tokens=[1])
    generator.next()  # `next` runs our `_next`: the prompt is prefilled and moved at once,
    # its last token in its chunk (its first token drawn from that chunk: `_first_tokens`)
    assert generator.prefilled_tokens == 4 and generator._generation_batch.uids == [uid]
    generator.close()
    # Without that, mlx-lm's way: all but the last token prefilled, the last run alone.
    unfolded = ServingBatchGenerator(
        model, completion_batch_size=4, prefill_step_size=64, fold_first_tokens=False
    )
    (uid,) = unfolded.insert([[5, 6, 7, 8]], max_tokens=[1])
    unfolded.next()
    assert unfolded.prefilled_tokens == 3 and unfolded._generation_batch.uids == [uid]
    unfolded.close()


def test_the_generation_batch_step_our_first_step_copies(model: Any) -> None:
    """`_first_tokens.FirstFromChunk` runs `GenerationBatch._step`'s lines after the forward
    and relies on the fields `__init__` sets: both unchanged since they were read."""
    assert _digest(_upstream.GenerationBatch._step) == "a18de19b690ba1fa"
    assert _digest(_upstream.GenerationBatch.__init__) == "f4966a4d5b090ae8"


def test_the_generation_batch_step_a_batch_verify_stands_in_for(model: Any) -> None:
    """`_batch_speculating.BatchSpeculation` runs a verify step in place of
    `GenerationBatch.next` (its `_step` and the checks after it, for several tokens a row),
    reading and setting the fields `__init__` sets, and calls `filter` and `extract_cache`
    as `next` does: `next` and `filter` unchanged since they were read."""
    assert _digest(_upstream.GenerationBatch.next) == "c47ddeb4b6577d19"
    assert _digest(_upstream.GenerationBatch.filter) == "280f084fc3a97e38"


@pytest.fixture(scope="module")
def whisper(tiny_whisper: Path) -> Any:
    from mlx_nursery.models import load_speech_model

    return load_speech_model(tiny_whisper).model


def test_the_whisper_decoding_parts_we_subclass_are_called_as_we_override_them(
    whisper: Any,
) -> None:
    assert _digest(_upstream.GreedyDecoder.update) == "8979ab34003f424e"
    assert list(_signature(_upstream.Inference.logits).parameters) == [
        "self",
        "tokens",
        "audio_features",
    ]
    calls: list[str] = []

    class Counting(_upstream.Inference):  # type: ignore[misc]
        def logits(self, tokens: mx.array, audio_features: mx.array) -> mx.array:
            calls.append("logits")
            return super().logits(tokens, audio_features)  # type: ignore[no-any-return]

    class Recording(_upstream.GreedyDecoder):  # type: ignore[misc]
        def update(self, tokens: mx.array, logits: mx.array, sum_logprobs: mx.array) -> Any:
            calls.append("update")
            return super().update(tokens, logits, sum_logprobs)

    options = _upstream.DecodingOptions(language="en", temperature=0.0, sample_len=3, fp16=False)
    task = _upstream.DecodingTask(whisper, options)
    task.inference = Counting(whisper)
    eot = whisper.get_tokenizer(language="en", task="transcribe").eot
    task.decoder = Recording(0.0, eot)
    assert (task.decoder.temperature, task.decoder.eot) == (0.0, eot)
    mel = mx.zeros((1, _upstream.N_FRAMES, whisper.dims.n_mels), dtype=whisper.dtype)
    (result,) = task.run(mel)
    assert calls and calls[0] == "logits"
    assert calls.count("logits") == calls.count("update")  # once each per token
    assert hasattr(result, "tokens") and hasattr(result, "avg_logprob")
    assert list(_signature(type(whisper)._detect_language).parameters) == [
        "self",
        "mel",
        "language",
    ]
    assert _upstream.detect_language(whisper, mel[0]) == "en"  # an English-only model's
