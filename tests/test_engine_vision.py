"""Images in prompts on the real engine, with the tiny random-weight Qwen2-VL model: the
image reaches the model, and batching changes nothing of what a request gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import trio
from PIL import Image

from mlx_nursery.engine import Engine, EngineConfig, GenerationRequest, SamplingParams, open_engine

from .helpers import Run, collect, collect_all


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
