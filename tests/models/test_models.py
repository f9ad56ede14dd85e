"""The model factory and loader."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer
from transformers import AutoTokenizer

from mlx_nursery.cli import main
from mlx_nursery.models import ModelNotFoundError, load_model, resolve_model_path
from mlx_nursery.tools import make_model


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_same_seed_same_bytes_other_seed_other_weights(tiny_model: Path, tmp_path: Path) -> None:
    assert main(["make-model", str(tmp_path / "again"), "--preset", "tiny", "--seed", "0"]) == 0
    assert digest(tmp_path / "again") == digest(tiny_model)
    other = digest(make_model(tmp_path / "other", "tiny", seed=1))
    assert other["model.safetensors"] != digest(tiny_model)["model.safetensors"]
    assert other["tokenizer.json"] == digest(tiny_model)["tokenizer.json"]


def test_factory_model_loads_with_padded_vocab_and_tool_parser(tiny_model: Path) -> None:
    loaded = load_model(tiny_model)
    config = json.loads((tiny_model / "config.json").read_text())
    tokenizer = loaded.tokenizer
    assert len(tokenizer.get_vocab()) == config["vocab_size"]
    assert tokenizer.has_tool_calling and tokenizer.tool_call_start == "<tool_call>"
    assert set(tokenizer.eos_token_ids) == set(config["eos_token_id"])
    text = 'What is the capital of France? 42 {"a": [1, 2]}'
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_vocab_is_padded_to_the_architecture_size(tmp_path: Path) -> None:
    path = make_model(tmp_path / "small", "small", seed=0)
    vocab_size = json.loads((path / "config.json").read_text())["vocab_size"]
    tokenizer = load_model(path).tokenizer
    assert len(tokenizer.get_vocab()) == vocab_size == 8192
    assert tokenizer.decode([vocab_size - 1]) == f"<filler_{vocab_size - 1}>"
    detokenizer = tokenizer.detokenizer
    for token in (vocab_size - 2, vocab_size - 1):
        detokenizer.add_token(token)
    detokenizer.finalize()
    assert detokenizer.text == f"<filler_{vocab_size - 2}><filler_{vocab_size - 1}>"


def test_every_preset_token_is_where_its_file_says_and_every_id_has_text(
    tmp_path: Path, tiny_model: Path, tiny_vlm: Path, tiny_embedding: Path, tiny_whisper: Path
) -> None:
    """tokenizer.json's added tokens get the ids the file gives them once loaded (the
    tokenizers library renumbers an added token its model's vocabulary lacks), and the
    ids run from 0 to the model's last embedding row without a hole. The larger presets
    write their tokenizers with these same writers."""
    thinking = make_model(tmp_path / "thinking", "tiny-thinking")
    opened = make_model(tmp_path / "open", "tiny-thinking-open")
    for path in (tiny_model, thinking, opened, tiny_vlm, tiny_embedding, tiny_whisper):
        spec = json.loads((path / "tokenizer.json").read_text())
        in_file = {token["content"]: token["id"] for token in spec["added_tokens"]}
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        assert {t: tokenizer.convert_tokens_to_ids(t) for t in in_file} == in_file, path.name
        rows = json.loads((path / "config.json").read_text())["vocab_size"]
        assert sorted(set(tokenizer.get_vocab().values())) == list(range(rows)), path.name
    for path in (thinking, opened):
        wrapper = load_tokenizer(path)  # mlx-lm's, as the server loads it
        spec = json.loads((path / "tokenizer.json").read_text())
        in_file = {token["content"]: token["id"] for token in spec["added_tokens"]}
        rows = json.loads((path / "config.json").read_text())["vocab_size"]
        assert tuple(wrapper.think_start_tokens) == (in_file["<think>"],) == (rows - 2,)
        assert tuple(wrapper.think_end_tokens) == (in_file["</think>"],) == (rows - 1,)
        assert wrapper.decode([rows - 3]) == f"<filler_{rows - 3}>"


def test_chat_template_renders_roles_tools_and_calls_without_double_encoding(
    tiny_model: Path,
) -> None:
    tokenizer = load_model(tiny_model).tokenizer
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": {"tz": "CET"}},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    assert text.startswith("<|im_start|>system\nBe brief.\n# Tools")
    assert '{"type": "function", "function": {"name": "get_weather"' in text
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    )
    assert '{"name": "get_time", "arguments": {"tz": "CET"}}' in text
    assert '\\"city\\"' not in text
    assert "<tool_response>\nsunny\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    parsed = tokenizer.tool_parser('{"name": "get_weather", "arguments": {"city": "Paris"}}', tools)
    assert parsed["name"] == "get_weather" and parsed["arguments"] == {"city": "Paris"}


def test_missing_model_names_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model_path(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(info.value)
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model_path("no-such-org/no-such-model")
    assert "Hugging Face cache" in str(info.value) and "no-such-org/no-such-model" in str(
        info.value
    )


def test_repo_id_in_the_local_hf_cache_resolves(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = tmp_path / "hub"
    snapshot = hub / "models--acme--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for f in tiny_model.iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())
    (hub / "models--acme--tiny" / "refs").mkdir()
    (hub / "models--acme--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert resolve_model_path("acme/tiny") == snapshot


def test_the_real_shape_vlm_preset_builds_in_both_packages() -> None:
    """`qwen2.5-vl-3b` (for GPU benchmarks; too large to write here): mlx-vlm builds it, and
    mlx-lm's text model for it has exactly the language model's parameter names and shapes,
    which loading a VLM shares. Parameters are counted without being allocated (lazy)."""
    import json

    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    from mlx_nursery.tools import PRESETS

    config = json.loads(json.dumps(PRESETS["qwen2.5-vl-3b"].config))
    arch, _ = get_model_and_args(config)
    params = {**json.loads(json.dumps(config)), "text_config": {}}
    vlm = arch.Model(
        update_module_configs(arch.ModelConfig.from_dict(params), arch, params, ["text", "vision"])
    )
    model_class, args_class = _get_classes(config)
    text = model_class(args_class.from_dict(config))

    def shapes(module: object) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in tree_flatten(module.parameters())}  # type: ignore[attr-defined]

    assert shapes(text.language_model) == shapes(vlm.language_model)
    counts = {
        part: sum(math.prod(s) for s in shapes(getattr(vlm, part)).values())
        for part in ("language_model", "vision_tower")
    }
    assert 3.0e9 < counts["language_model"] < 3.2e9
    assert 0.6e9 < counts["vision_tower"] < 0.7e9
