"""Write loadable vision-language model directories offline (random weights, Qwen2-VL).

The weights come from mlx-vlm's own model class, so their names and shapes are what
`mlx_vlm.load` expects; the tokenizer is the text factory's with Qwen2-VL's vision tokens;
the image processor is configured so that any image becomes a few image tokens. Text
weights are scaled up: at random init a tiny model's logits are nearly flat, and greedy
output would repeat one id whatever the image, which would let tests that compare images
prove nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map_with_path

from ._chat_template import VISION_CHAT_TEMPLATE
from ._tokenizer_factory import EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, write_tokenizer

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def write_vlm(out: Path, preset: Any, dtype: str, seed: int) -> None:
    """Write `preset` (a vision `Preset`) into `out`: config, weights, tokenizer, processor."""
    context_length = int(preset.config["max_position_embeddings"])
    ids = write_tokenizer(
        out,
        preset.trained_vocab,
        preset.vocab_size,
        context_length,
        special_tokens=[*SPECIAL_TOKENS, *VISION_TOKENS],
        chat_template=VISION_CHAT_TEMPLATE,
    )
    (out / "chat_template.jinja").write_text(VISION_CHAT_TEMPLATE, "utf-8")
    config = dict(preset.config)
    config.update(
        eos_token_id=[ids[EOS_TOKEN], ids[PAD_TOKEN]],
        pad_token_id=ids[PAD_TOKEN],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        torch_dtype=dtype,
        mlx_nursery_preset=preset.name,
    )
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), "utf-8")
    _write_processor(out, preset.image_processor, _PROCESSORS[config["model_type"]])
    _write_weights(out, config, getattr(mx, dtype), seed)


_PROCESSORS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor"}
"""The processor class mlx-vlm registers for each architecture the factory writes."""


def _write_processor(out: Path, image: dict[str, Any], processor_class: str) -> None:
    processor = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": processor_class,
        "do_resize": True,
        "do_rescale": True,
        "do_normalize": True,
        "do_convert_rgb": True,
        "rescale_factor": 1 / 255,
        "image_mean": _CLIP_MEAN,
        "image_std": _CLIP_STD,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        **image,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(processor, indent=2), "utf-8")
    (out / "processor_config.json").write_text(
        json.dumps({"processor_class": processor_class}, indent=2), "utf-8"
    )


def _write_weights(out: Path, config: dict[str, Any], dtype: mx.Dtype, seed: int) -> None:
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    mx.random.seed(seed)
    arch, _ = get_model_and_args(config)
    params = json.loads(json.dumps(config))  # from_dict changes what it is given
    params.setdefault("text_config", {})
    model_config = update_module_configs(  # type: ignore[no-untyped-call]
        arch.ModelConfig.from_dict(params), arch, params, ["text", "vision"]
    )
    model = arch.Model(model_config)
    model.set_dtype(dtype)

    def scaled(path: str, value: mx.array) -> mx.array:
        text = path.startswith("language_model.") and "norm" not in path
        return value * 2 if text else value

    model.update(tree_map_with_path(scaled, model.parameters()))
    flat: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    arrays = dict(sorted(flat, key=lambda kv: kv[0]))
    mx.eval(list(arrays.values()))
    mx.save_safetensors(str(out / "model.safetensors"), arrays, metadata={"format": "mlx"})
