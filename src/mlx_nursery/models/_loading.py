"""Resolve and load models without ever reaching a model hub.

A model is a local directory (mlx-lm layout) or a repo id already present in
the local Hugging Face cache. Loading dispatches on the model's kind so that
mlx-vlm models can plug in beside mlx-lm ones, and embedding models and cross-encoders
(mlx-embeddings' encoders) beside both.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import attrs

from ._cross_encoder import is_cross_encoder
from ._embedding_loading import EmbeddingSpec, embedding_input_length, is_embedding_model
from ._kv_layout import KVLayout, kv_layout
from ._synthesis import TTS_MODEL_TYPES, synthesis_voices
from .scripted import SCRIPTED_KIND, SCRIPTED_MODEL, ensure_scripted_model

if TYPE_CHECKING:
    from mlx.nn.layers.base import Module
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from transformers import PreTrainedTokenizerBase, ProcessorMixin

    from ._lora import AdapterBank

log = logging.getLogger("mlx_nursery.models")

ModelKind = Literal["lm", "vlm", "scripted", "stt", "tts", "embedding", "reranker"]
"""A text model (mlx-lm), a vision-language model (mlx-vlm with mlx-lm's text model), the
scripted model, a speech-to-text model (Whisper, mlx-audio: `models/_speech.py`), a
text-to-speech model (KittenTTS, Kokoro, mlx-audio: `models/_synthesis.py`), an embedding
model (mlx-embeddings: `models/_embedding_loading.py`), or a cross-encoder (a reranker:
`models/_cross_encoder.py`)."""


class ModelNotFoundError(LookupError):
    """No model at the given path, nor in the local Hugging Face cache."""


class ModelLoadError(RuntimeError):
    """The model exists but cannot be loaded (unsupported kind, broken files)."""


@attrs.frozen
class Vision:
    """A vision-language model's image side: mlx-vlm's whole model (vision tower, and the
    language model that takes embeddings and multimodal positions) and its processor."""

    model: Module
    """mlx-vlm's model of the checkpoint."""
    processor: ProcessorMixin
    """Its processor (tokenizer and image processor; no MLX)."""


@attrs.frozen
class LoadedModel:
    """A model and its tokenizer, loaded on (and only to be used from) the engine thread.

    `model` is an mlx-lm text model, which the engine batches; a vision-language
    model's `vision` encodes images and prefills prompts that hold them, on the same
    weights (mlx-lm's text model of the checkpoint shares the arrays of mlx-vlm's). The
    scripted model (kind "scripted", models/scripted.py) has a tokenizer and no model. An
    embedding model (kind "embedding") is mlx-embeddings' model, with a Hugging Face
    tokenizer and its `embedding` spec (pooling, sizes); a cross-encoder (kind "reranker")
    is its encoder under its classification head, with a spec whose `classifier` is set."""

    path: Path
    kind: ModelKind
    model: Module | None
    """None for the scripted model, which computes nothing."""
    tokenizer: TokenizerWrapper | PreTrainedTokenizerBase
    """mlx-lm's wrapper (its streaming detokenizer); an embedding model's is Hugging Face's."""
    config: dict[str, Any]
    vision: Vision | None = None
    embedding: EmbeddingSpec | None = None
    draft: Module | None = None
    adapters: AdapterBank | None = None
    """The LoRA adapters served on this model per request (`_lora.py`), where enabled; their
    projections replace the model's own (None: no adapters)."""
    """A draft model for speculative decoding (`--draft-model`), loaded beside this one on
    the same thread; None without."""

    @property
    def context_length(self) -> int:
        if self.embedding is not None:
            return self.embedding.context_length
        for key in ("max_position_embeddings", "max_seq_len", "n_ctx"):
            if isinstance(self.config.get(key), int):
                return int(self.config[key])
        return int(getattr(self.tokenizer, "model_max_length", 4096))

    @property
    def vocab_size(self) -> int:
        """The token ids the model takes: its embedding rows, as its arguments (mlx-lm builds
        the embedding from them, and loading checks the weights' shapes against it) or its
        config say. Often past the tokenizer's last id: checkpoints pad the rows."""
        text = self.config.get("text_config")
        for size in (
            getattr(getattr(self.model, "args", None), "vocab_size", None),
            self.config.get("vocab_size"),
            text.get("vocab_size") if isinstance(text, dict) else None,
        ):
            if isinstance(size, int) and size > 0:
                return size
        return max(self.tokenizer.get_vocab().values(), default=-1) + 1


def resolve_model_path(spec: str | Path) -> Path:
    """Return a local directory for `spec`, a path or a cached `org/name` repo id, or the
    built-in scripted model's (`scripted`, unless a directory of that name exists)."""
    path = Path(spec).expanduser()
    if str(spec) == SCRIPTED_MODEL and not path.exists():
        return ensure_scripted_model()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a directory but has no config.json")
        return path.resolve()
    looked = [f"path {path.resolve()}"]
    repo = str(spec)
    if repo.count("/") == 1 and not repo.startswith((".", "/", "~")):
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        looked.append(f"Hugging Face cache {constants.HF_HUB_CACHE} (repo {repo})")
        try:
            return Path(snapshot_download(repo, local_files_only=True))
        except (LocalEntryNotFoundError, FileNotFoundError, ValueError):
            pass
    raise ModelNotFoundError(
        f"model {spec!r} not found; looked at: {'; '.join(looked)}. "
        "Models are never downloaded: pass a local directory or pre-populate the cache."
    )


def model_kind(path: Path) -> ModelKind:
    return _kind_of(path, _read_config(path))


def _read_config(path: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((path / "config.json").read_text("utf-8"))
    return config


def _kind_of(path: Path, config: dict[str, Any]) -> ModelKind:
    if config.get("mlx_nursery_kind") == SCRIPTED_KIND:
        return "scripted"
    if config.get("model_type") == "whisper":
        return "stt"
    if config.get("model_type") in TTS_MODEL_TYPES:
        return "tts"
    if "vision_config" in config:
        return "vlm"
    if is_cross_encoder(config):
        return "reranker"
    return "embedding" if is_embedding_model(path, config) else "lm"


@attrs.frozen
class ModelFacts:
    """What a model directory says of itself before it is loaded (no MLX): for the model
    list and for deciding whether it fits beside the models loaded already."""

    kind: ModelKind
    context_length: int | None
    """The model's own context (its config's); the served one may be less (KV budget)."""
    weight_bytes: int
    """The size of its weight files: what loading it adds to MLX's active memory."""
    kv_layout: KVLayout | None = None
    """What a token's KV costs it (None: not known before it loads)."""
    voices: tuple[str, ...] | None = None
    """A text-to-speech model's voices (None for other kinds)."""


def model_facts(path: Path) -> ModelFacts:
    """Read `path`'s config and weight files' sizes. Raises ModelLoadError for a config that
    is not a JSON object. File reads: call it from a worker thread."""
    try:
        config = json.loads((path / "config.json").read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: unreadable config.json ({exc})") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path}: config.json is not an object")
    text = config.get("text_config")
    context = None
    for source in (config, text if isinstance(text, dict) else {}):
        for key in ("max_position_embeddings", "max_seq_len", "n_ctx"):
            if context is None and isinstance(source.get(key), int):
                context = int(source[key])
    weights = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    kind = _kind_of(path, config)
    if kind in ("embedding", "reranker"):
        context = embedding_input_length(path, config)
    layout = kv_layout(path, config) if kind in ("lm", "vlm") else None
    voices = synthesis_voices(path, config) if kind == "tts" else None
    return ModelFacts(kind, context, weights, layout, voices)


def _load_lm(path: Path, _: dict[str, Any]) -> LoadedModel:
    """mlx-lm's model and tokenizer, and the config as mlx-lm reads it: its loader reads the
    file itself and adds generation_config.json's eos ids, so the one read here is unused."""
    from mlx_lm.utils import load

    model, tokenizer, config = load(str(path), return_config=True)
    return LoadedModel(path=path, kind="lm", model=model, tokenizer=tokenizer, config=config)


def _load_vlm(path: Path, config: dict[str, Any]) -> LoadedModel:
    """mlx-vlm loads the checkpoint; mlx-lm's text model for it is built on the same arrays
    (no second copy of the weights), so that the engine batches its decoding as any text
    model's. Only architectures that both packages know are served."""
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from mlx_lm.utils import _get_classes
    from mlx_vlm.utils import load as load_vlm

    try:
        model_class, args_class = _get_classes(config)
    except ValueError as exc:
        raise ModelLoadError(f"{path}: mlx-lm has no text model for this VLM ({exc})") from exc
    vlm, processor = load_vlm(str(path))
    text = model_class(args_class.from_dict(config))
    language = getattr(text, "language_model", None)
    if language is None:
        raise ModelLoadError(f"{path}: this VLM's text model has no language_model to share")
    language.update(tree_unflatten(tree_flatten(vlm.language_model.parameters())))
    tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    return LoadedModel(
        path=path,
        kind="vlm",
        model=text,
        tokenizer=tokenizer,
        config=config,
        vision=Vision(vlm, processor),
    )


def _load_scripted(path: Path, config: dict[str, Any]) -> LoadedModel:
    """The scripted model: its tokenizer alone (no MLX arrays: nothing to compute)."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    return LoadedModel(path=path, kind="scripted", model=None, tokenizer=tokenizer, config=config)


def _load_embedding(path: Path, config: dict[str, Any]) -> LoadedModel:
    """mlx-embeddings' model and the checkpoint's tokenizer; pooling from its files."""
    from ._embedding_loading import EmbeddingConfigError, load_embedding_parts

    try:
        model, tokenizer, spec = load_embedding_parts(path, config)
    except EmbeddingConfigError as exc:
        raise ModelLoadError(f"this embedding model is not served: {exc}") from exc
    except ValueError as exc:  # mlx-embeddings: "Model type ... not supported."
        raise ModelLoadError(f"{path}: mlx-embeddings cannot load it ({exc})") from exc
    return LoadedModel(
        path=path, kind="embedding", model=model, tokenizer=tokenizer, config=config, embedding=spec
    )


def _load_reranker(path: Path, config: dict[str, Any]) -> LoadedModel:
    """The cross-encoder's encoder (mlx-embeddings') under its head, the tokenizer."""
    from ._cross_encoder import load_cross_encoder_parts
    from ._embedding_loading import EmbeddingConfigError

    try:
        model, tokenizer, spec = load_cross_encoder_parts(path, config)
    except EmbeddingConfigError as exc:
        raise ModelLoadError(f"this cross-encoder is not served: {exc}") from exc
    except ValueError as exc:  # MLX: weights that are not the architecture's
        raise ModelLoadError(f"{path}: its weights do not fit its architecture ({exc})") from exc
    return LoadedModel(
        path=path, kind="reranker", model=model, tokenizer=tokenizer, config=config, embedding=spec
    )


def _not_generative(path: Path, _: dict[str, Any]) -> LoadedModel:
    raise ModelLoadError(f"{path}: a speech model; the speech runtimes serve it")


_LOADERS: dict[ModelKind, Callable[[Path, dict[str, Any]], LoadedModel]] = {
    "lm": _load_lm,
    "vlm": _load_vlm,
    "scripted": _load_scripted,
    "embedding": _load_embedding,
    "reranker": _load_reranker,
    "stt": _not_generative,
    "tts": _not_generative,
}


def load_model(spec: str | Path, *, fuse_weights: bool = True) -> LoadedModel:
    """Resolve and load a model. `fuse_weights`: a text model's (or a VLM's language
    model's) q/k/v and gate/up projections run as one matmul each (`_fusing`), where its
    architecture is covered. Makes MLX calls: call it on the engine thread."""
    path = resolve_model_path(spec)
    config = _read_config(path)  # read once: it says the kind, and its loader builds on it
    loaded = _LOADERS[_kind_of(path, config)](path, config)
    if fuse_weights and loaded.model is not None and loaded.kind in ("lm", "vlm"):
        _fuse(loaded.model, loaded.vision)
    return loaded


def _fuse(model: Module, vision: Vision | None) -> None:
    from ._fusing import fuse_projections

    if vision is not None:
        # mlx-vlm's language model (image prefills) holds the same arrays: fused alike.
        language = model.language_model
        fusion = fuse_projections(language, shared_with=vision.model.language_model)
    else:
        fusion = fuse_projections(model)
    if fusion.fused:
        log.info(
            "fused projections: q/k/v in %d attention blocks, gate/up in %d MLP blocks",
            fusion.attention,
            fusion.mlp,
        )
