"""Images in prompts on the real engine, with the tiny random-weight Qwen2-VL model: the
image reaches the model, and batching changes nothing of what a request gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import trio
from PIL import Image

from mlx_nursery.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, open_engine
from tests.helpers import CallSignal, Run, collect, collect_all


def picture(seed: int, size: tuple[int, int] = (80, 64)) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def chat_text(engine: Engine, question: str, images: int) -> str:
    parts = [{"type": "image"}] * images + [{"type": "text", "text": question}]
    vision = engine.model.vision
    assert vision is not None
    template: str = engine.model.tokenizer.apply_chat_template(
        [{"role": "user", "content": parts}], tokenize=False, add_generation_prompt=True
    )
    return template


async def image_request(
    engine: Engine, question: str, images: list[Image.Image], **kwargs: object
) -> GenerationRequest:
    vision = engine.model.vision
    assert vision is not None
    text = chat_text(engine, question, len(images))
    tokens, inputs = await trio.to_thread.run_sync(vision.prepare, text, images)
    kwargs.setdefault("max_tokens", 12)
    kwargs.setdefault("sampling", SamplingParams(temperature=0.0))
    return GenerationRequest(tokens, images=inputs, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
async def vlm_engine(tiny_vlm: Path) -> Engine:  # type: ignore[misc]
    async with open_engine(EngineConfig(tiny_vlm, max_concurrency=4)) as engine:
        yield engine


async def test_the_image_reaches_the_model(vlm_engine: Engine) -> None:
    """Same text: two images give different tokens, the same image twice the same (the
    prefix cache, on here, must not hand one image's prompt state to another)."""
    first = await collect(vlm_engine, await image_request(vlm_engine, "What is it?", [picture(1)]))
    other = await collect(vlm_engine, await image_request(vlm_engine, "What is it?", [picture(2)]))
    again = await collect(vlm_engine, await image_request(vlm_engine, "What is it?", [picture(1)]))
    assert len(first.tokens) == 12
    assert first.tokens != other.tokens
    assert again.tokens == first.tokens
    usage = first.final.usage
    assert usage is not None and usage.cached_tokens == 0


async def test_several_images_in_one_prompt_all_count(vlm_engine: Engine) -> None:
    both = await image_request(vlm_engine, "Compare them.", [picture(1), picture(2)])
    swapped = await image_request(vlm_engine, "Compare them.", [picture(2), picture(1)])
    assert both.images is not None and both.images.images == 2
    assert both.images.image_tokens > 0
    runs = [await collect(vlm_engine, both), await collect(vlm_engine, swapped)]
    assert runs[0].tokens != runs[1].tokens


async def test_batched_image_and_text_requests_give_what_each_gives_alone(
    vlm_engine: Engine,
) -> None:
    requests = [
        await image_request(vlm_engine, "What is it?", [picture(1)]),
        await image_request(vlm_engine, "Describe the picture.", [picture(3, (120, 40))]),
        GenerationRequest(
            vlm_engine.model.tokenizer.encode(chat_text(vlm_engine, "Just text.", 0)),
            max_tokens=12,
            sampling=SamplingParams(temperature=0.0),
        ),
        await image_request(
            vlm_engine, "Sampled.", [picture(4)], sampling=SamplingParams(temperature=0.8, seed=5)
        ),
    ]
    alone: list[Run] = [await collect(vlm_engine, r) for r in requests]
    before = vlm_engine.statistics().worker
    together = await collect_all(vlm_engine, requests)
    after = vlm_engine.statistics().worker
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert before is not None and after is not None
    batched = (after.steps - after.solo_steps) - (before.steps - before.solo_steps)
    assert batched >= 12  # they shared the batch, not the fast path one by one


async def test_an_image_prompt_is_prefilled_in_chunks_and_a_cancel_lands_between_them(
    tiny_vlm: Path,
) -> None:
    """Prefill chunks of one token: the image prompt takes one engine iteration per token,
    beside another stream's decode steps; stopped a few iterations in, it ends there, with
    no token computed."""
    config = EngineConfig(tiny_vlm, max_concurrency=4, prefill_step_size=1)
    async with open_engine(config) as engine:
        token = trio.lowlevel.current_trio_token()
        started = CallSignal(token, after_calls=2)
        later = CallSignal(token, after_calls=10**9)
        text = GenerationRequest(
            engine.model.tokenizer.encode(chat_text(engine, "Keep going.", 0)),
            max_tokens=200,
            sampling=SamplingParams(temperature=0.0),
            logits_processors=[started, later],
            ignore_eos=True,
        )
        image = await image_request(engine, "What is it?", [picture(1)])
        runs: list[Run] = []

        async def run_text() -> None:
            runs.append(await collect(engine, text))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_text)
            await started.event.wait()
            async with engine.generate(image) as stream:
                later.arm(4)
                await later.event.wait()  # a few iterations: a few of its ~25 chunks
                stream.stop()
                events = [event async for event in stream]
        assert [e.finish_reason for e in events] == ["cancelled"]
        usage = events[0].usage
        assert usage is not None and usage.completion_tokens == 0  # stopped mid-prefill
        stats = engine.statistics()
        assert len(runs[0].tokens) == 200
        assert stats.lanes_borrowed == 0 and stats.cancellations.confirmed == 1
        assert stats.worker is not None and stats.worker.failed_steps == 0
        # The engine serves image prompts on after it.
        assert len((await collect(engine, image)).tokens) == 12


async def test_a_preempted_image_sequence_is_replayed_with_its_images(tiny_vlm: Path) -> None:
    """A KV budget of 1,024 tokens (the tiny VLM's KV is 512 bytes a token, as the tiny
    text model's): the image sequence joins a long text one, is preempted as they grow,
    and replayed through the vision tower: the same tokens as alone."""
    config = EngineConfig(
        tiny_vlm, max_concurrency=4, prompt_cache_bytes=0, kv_cache_bytes=1024 * 512
    )
    async with open_engine(config) as engine:
        token = trio.lowlevel.current_trio_token()
        signal = CallSignal(token, after_calls=5)
        encoded = engine.model.tokenizer.encode(chat_text(engine, "A long answer.", 0))
        long = GenerationRequest(encoded, max_tokens=600, ignore_eos=True)
        image = await image_request(
            engine,
            "What is it?",
            [picture(1)],
            max_tokens=600,
            ignore_eos=True,
            sampling=SamplingParams(temperature=0.8, seed=9),
        )
        alone = await collect(engine, image)
        signalled = attrs.evolve(long, logits_processors=[signal])
        runs: list[Run] = []

        async def run_long() -> None:
            runs.append(await collect(engine, signalled))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_long)
            await signal.event.wait()
            joined = await collect(engine, image)
        worker = engine.statistics().worker
        assert worker is not None and worker.preemptions == 1
        assert joined.tokens == alone.tokens
        assert len(runs[0].tokens) == 600


async def test_a_cached_prefix_that_covers_the_images_is_reused_and_changes_nothing(
    tiny_vlm: Path,
) -> None:
    """The prefix cache keys an image's placeholders by the image: the same image and text
    again reuse the whole prefix, a second turn reuses the first turn's images, another
    image reuses nothing past the text before it; every answer equals a cacheless engine's."""

    def conversation(engine: Engine, seed: int, turns: int) -> tuple[str, list[Image.Image]]:
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}
        ]
        for turn in range(1, turns):
            messages += [
                {"role": "assistant", "content": f"Answer {turn}."},
                {"role": "user", "content": f"And then {turn}?"},
            ]
        text: str = engine.model.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return text, [picture(seed)]

    async def ask(engine: Engine, seed: int, turns: int) -> tuple[Run, int]:
        vision = engine.model.vision
        assert vision is not None
        text, images = conversation(engine, seed, turns)
        tokens, inputs = await trio.to_thread.run_sync(vision.prepare, text, images)
        request = GenerationRequest(
            tokens, max_tokens=6, sampling=SamplingParams(temperature=0.0), images=inputs
        )
        image_id = int(json.loads((tiny_vlm / "config.json").read_text())["image_token_id"])
        return await collect(engine, request), max(
            i + 1 for i, t in enumerate(tokens) if t == image_id
        )

    asked = [(1, 1), (1, 1), (1, 2), (2, 1), (1, 3)]
    async with open_engine(EngineConfig(tiny_vlm, prompt_cache_bytes=0)) as engine:
        expected = [(await ask(engine, seed, turns))[0].tokens for seed, turns in asked]
    async with open_engine(EngineConfig(tiny_vlm)) as engine:
        runs = [await ask(engine, seed, turns) for seed, turns in asked]
    assert [run.tokens for run, _ in runs] == expected
    cached = [run.final.usage.cached_tokens for run, _ in runs if run.final.usage]
    images_end = [end for _, end in runs]
    assert cached[0] == 0
    assert cached[1] >= images_end[1]  # the same request again
    assert cached[2] >= images_end[2]  # a second turn over the first turn's image
    assert cached[3] < images_end[3] - 1  # another image: nothing past the text before it
    assert cached[4] >= images_end[4]


async def test_the_qwen2_5_vl_family_loads_and_takes_images(tmp_path: Path) -> None:
    """The real-shape benchmark preset is Qwen2.5-VL (too large to write here): a tiny
    model of that architecture, written by the same factory, loads and answers images."""
    from mlx_nursery.tools import PRESETS, Preset
    from mlx_nursery.tools._vlm_factory import write_vlm

    tiny = PRESETS["tiny-vlm"].config
    config = {
        **tiny,
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "vision_config": {
            **tiny["vision_config"],
            "model_type": "qwen2_5_vl",
            "hidden_size": 32,
            "intermediate_size": 64,
            "out_hidden_size": 64,
            "window_size": 56,
            "fullatt_block_indexes": [1],
        },
    }
    preset = Preset("tiny-vlm-2.5", config, 2048, PRESETS["tiny-vlm"].image_processor)
    write_vlm(tmp_path, preset, "float32", 0)
    async with open_engine(EngineConfig(tmp_path, prompt_cache_bytes=0)) as engine:
        first = await collect(engine, await image_request(engine, "What?", [picture(1)]))
        other = await collect(engine, await image_request(engine, "What?", [picture(2)]))
    assert len(first.tokens) == 12 and first.tokens != other.tokens


async def test_an_image_prompt_is_served_from_disk_for_its_own_image_alone(
    tiny_vlm: Path, tmp_path: Path
) -> None:
    """The disk tier (`--prompt-cache-dir`) knows an image prompt by its image, as memory
    does: after a restart the same picture's prompt is read back and gives the cold run's
    tokens; another picture's is not."""
    question = "Describe everything in this picture in great detail, please. " * 12
    config = EngineConfig(tiny_vlm, warmup=False, prompt_cache_dir=tmp_path)

    async def serve(seed: int) -> Run:
        async with open_engine(config) as engine:
            request = await image_request(engine, question, [picture(seed, (160, 160))])
            return await collect(engine, request)

    cold = await serve(1)
    warm, other = await serve(1), await serve(2)
    assert cold.final.usage is not None and cold.final.usage.prompt_tokens > 256
    assert warm.final.usage is not None
    assert warm.final.usage.cached_tokens == cold.final.usage.prompt_tokens - 1
    assert warm.tokens == cold.tokens
    assert other.final.usage is not None and other.final.usage.cached_tokens == 0
    assert other.tokens != cold.tokens
