"""House rules that review alone would let slip: each package's public names are pinned,
and no module imports another package's private modules (the one-way layering http ->
openai/anthropic -> generation -> engine -> models/store goes through each package's `__all__`)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "mlx_nursery"
PACKAGES = (
    "anthropic",
    "engine",
    "generation",
    "http",
    "models",
    "openai",
    "serving",
    "settings",
    "store",
    "testing",
    "tools",
)


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """Absolute names of what `source` (a module of `package`) imports, relative imports
    resolved; `from a import b` yields both `a` and `a.b`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            found.extend((node.lineno, f"{target}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return found


def private_imports(source: str, package: str) -> list[tuple[int, str]]:
    """Imports of another package's private modules (`mlx_nursery.<pkg>._name`)."""
    home = package.split(".")[1] if "." in package else ""
    offences = []
    for line, target in imported_modules(source, package):
        parts = target.split(".")
        if parts[0] != "mlx_nursery" or len(parts) < 3 or parts[1] not in PACKAGES:
            continue
        if parts[2].startswith("_") and parts[1] != home:
            offences.append((line, target))
    return offences


def package_of(path: Path) -> str:
    parts = path.relative_to(SRC.parent).parts
    return ".".join(parts[:-1])


def test_no_module_imports_another_packages_private_modules() -> None:
    offences = [
        f"{path.relative_to(SRC)}:{line} imports {target}"
        for path in sorted(SRC.rglob("*.py"))
        for line, target in private_imports(path.read_text(), package_of(path))
    ]
    assert offences == []


@pytest.mark.parametrize(
    "source, package, offending",
    [
        ("from ..openai._json import parse_json", "mlx_nursery.http", True),
        ("from ..openai import parse_json", "mlx_nursery.http", False),
        ("from .http._routes import routes", "mlx_nursery", True),
        ("from .http import routes", "mlx_nursery", False),
        ("from ._jobs import Jobs", "mlx_nursery.http", False),
        ("import mlx_nursery.engine._worker", "mlx_nursery.http", True),
        ("from mlx_nursery.engine import _worker", "mlx_nursery.openai", True),
        ("from . import _params", "mlx_nursery.openai", False),
    ],
)
def test_the_rule_tells_private_from_public(source: str, package: str, offending: bool) -> None:
    assert bool(private_imports(source, package)) == offending


PUBLIC = {
    "anthropic": [
        "MessageContent",
        "MessageEvents",
        "MessagesRequest",
        "count_tokens",
        "error_body",
        "error_status",
        "image_urls",
        "message_body",
        "parse_count_request",
        "parse_messages_request",
        "prepare_messages",
    ],
    "engine": [
        "AudioChunk",
        "SYNTHESIS_THREAD_NAME",
        "SynthesisConfig",
        "SynthesisEngine",
        "SynthesisEvent",
        "SynthesisModelInfo",
        "SynthesisRequest",
        "SynthesisStatistics",
        "Synthesized",
        "CONSUMER_STALLED",
        "CancelStatistics",
        "EMBEDDING_THREAD_NAME",
        "Embedder",
        "EmbedderConfig",
        "EmbeddingFailed",
        "EmbeddingModelInfo",
        "EmbeddingRequest",
        "Engine",
        "EngineConfig",
        "DiskCacheStats",
        "EngineError",
        "EngineOverloaded",
        "EngineStatistics",
        "EngineUnavailable",
        "FinishReason",
        "GenerationRequest",
        "GrammarProcessor",
        "ImageInputs",
        "KV_BITS",
        "LogitsProcessor",
        "KV_GROUP_SIZES",
        "ModelInfo",
        "PrefixCache",
        "PrefixCacheStats",
        "PRIORITY_LIMIT",
        "PromptTooLong",
        "SamplingParams",
        "Script",
        "THREAD_NAME",
        "ThinkingGate",
        "TokenEvent",
        "TokenLogprob",
        "TokenStream",
        "Tokenizer",
        "Usage",
        "VisionProcessor",
        "WAIT_BUCKETS",
        "WaitStatistics",
        "WorkerStats",
        "default_memory_budget",
        "kv_budget",
        "memory_in_cache",
        "memory_in_use",
        "DEFAULT_TEMPERATURES",
        "SAMPLE_RATE",
        "SPEECH_THREAD_NAME",
        "SPECULATION_METHODS",
        "Segment",
        "Speculation",
        "SpeechConfig",
        "SpeechEngine",
        "SpeechEvent",
        "SpeechModelInfo",
        "SpeechStatistics",
        "SpeechTask",
        "Transcript",
        "TranscriptionRequest",
        "Window",
        "Word",
        "open_engine",
        "AdapterBusy",
        "AdapterError",
        "AdaptersDisabled",
        "UnknownAdapter",
    ],
    "generation": [
        "AudioLimits",
        "AudioUpload",
        "decode_audio",
        "sniff_format",
        "check_between",
        "api_error",
        "context_length_error",
        "engine_errors_as_api_errors",
        "request_cancelled",
        "TemplateVariables",
        "check_token_ids",
        "template_variables",
        "text_tokens",
        "shown_tools",
        "request_timed_out",
        "Admitted",
        "ChatMessage",
        "ChunkWire",
        "Conflict",
        "ConnectionDropped",
        "FaultStatus",
        "Finished",
        "Forbidden",
        "FunctionTool",
        "GenerationFailed",
        "Grammars",
        "HeadersTooLarge",
        "ImageLimits",
        "ImageRef",
        "ImageTaker",
        "InvalidRequest",
        "LogprobEntry",
        "MediaFetches",
        "ModelCard",
        "ModelList",
        "ModelNotFound",
        "NamedToolChoice",
        "OpenAIError",
        "Output",
        "Overloaded",
        "RateLimited",
        "Prepared",
        "ReasoningDelta",
        "RequestCaps",
        "RequestCancelled",
        "ClientTooSlow",
        "RequestTimeout",
        "RequestTooLarge",
        "ResourceNotFound",
        "ResponseFormat",
        "SamplingFields",
        "SegmentEncoder",
        "ServedModel",
        "Tagged",
        "TextDelta",
        "TextFormat",
        "TextFormatParam",
        "TextJsonSchemaFormat",
        "ToolCallOut",
        "ToolChoiceMode",
        "ToolChoiceType",
        "URITooLong",
        "Unavailable",
        "UnsupportedMediaType",
        "Wire",
        "WireTraits",
        "answer_only",
        "card_kind",
        "chat_images",
        "check_before_fetching",
        "check_count",
        "check_prompt_size",
        "checkpoint",
        "common",
        "completion_tokens",
        "fetch_images",
        "forces_call",
        "generate_text",
        "ignored_hints",
        "ignored_values",
        "image_taker",
        "input_modalities",
        "last_user_text",
        "longest_token_bytes",
        "new_id",
        "now",
        "offered_tools",
        "parse_json",
        "parse_media_hosts",
        "prepared_for",
        "prompt_texts",
        "prompted_tools",
        "quoted",
        "register_lenient",
        "register_tagged_union",
        "register_unstructure_hook",
        "reject_unimplemented",
        "render_served",
        "render_served_template",
        "requested_model",
        "require",
        "responses_images",
        "strict_tool_names",
        "structure",
        "switchable",
        "thinking_format",
        "thinking_on",
        "thinking_switch",
        "to_json",
        "tool_format",
        "unknown_model",
        "unstructure_fields",
        "with_logprobs",
        "with_processors",
        "with_reasoning",
        "with_response_format",
        "with_tools",
    ],
    "http": [
        "AccessPolicy",
        "HYPERCORN_HEAD_BYTES",
        "OPEN_FILES_RESERVE",
        "ConnectionCap",
        "DROP_CONNECTION",
        "LifetimeHTTPConnection",
        "RequestLimits",
        "ShieldFinalBody",
        "body_left_unread",
        "current_record",
        "envelope_response",
        "error_response",
        "is_messages_route",
        "leave_body_unread",
        "raise_open_files_limit",
        "request_class_for",
        "routes",
        "serve_http",
        "tenant_of",
    ],
    "models": [
        "SynthesisModel",
        "SynthesizedPiece",
        "load_synthesis_model",
        "Activation",
        "Classifier",
        "EmbeddingSpec",
        "LoadedModel",
        "ModelFacts",
        "ModelLoadError",
        "ModelNotFoundError",
        "PoolingMode",
        "load_model",
        "load_speech_model",
        "SpeechModel",
        "model_facts",
        "model_kind",
        "release_mlx_streams",
        "resolve_model_path",
        "AdapterBank",
        "AdapterError",
        "FusedPart",
        "fused_sizes",
    ],
    "openai": [
        "PreparedSynthesis",
        "audio_delta_event",
        "audio_done_event",
        "EncodingFailed",
        "SpeechEncoder",
        "encodable",
        "pcm16",
        "prepare_synthesis",
        "wav_header",
        "EmbeddingLimits",
        "PreparedEmbeddings",
        "PreparedRerank",
        "PreparedResponse",
        "PreparedScore",
        "PreparedSpeech",
        "RESPONSE_FORMATS",
        "ResponseBuilder",
        "ResponsesRequest",
        "ServedEmbedder",
        "Tokenized",
        "delta_event",
        "done_event",
        "embeddings_body",
        "failed_event",
        "input_items_page",
        "parse_responses_request",
        "prepare_chat",
        "prepare_completion",
        "prepare_detokenize",
        "prepare_embeddings",
        "prepare_rerank",
        "prepare_response",
        "prepare_score",
        "prepare_speech",
        "prepare_tokenize",
        "rerank_body",
        "run_embeddings",
        "score_body",
        "speech_model_name",
        "transcript_body",
    ],
    "serving": [
        "synthesizing",
        "ANONYMOUS",
        "ASGIApp",
        "METRICS_CONTENT_TYPE",
        "PREPARE_THREADS",
        "BackgroundLaunch",
        "BackgroundLimits",
        "BackgroundResponses",
        "BodyRenderer",
        "Caller",
        "Detach",
        "EmbeddingCalls",
        "Extension",
        "Extensions",
        "Generations",
        "Job",
        "JobItem",
        "JobStarter",
        "Jobs",
        "LiveRequest",
        "LiveRequests",
        "Metrics",
        "ModelOpener",
        "ModelSource",
        "OutputHook",
        "Parts",
        "PieceRenderer",
        "PlanHook",
        "Preparation",
        "Recipe",
        "RenderedStream",
        "RequestRecord",
        "Service",
        "StreamRenderer",
        "Tenant",
        "WriteBatcher",
        "WritePolicy",
        "collect",
        "embedding",
        "ended_early",
        "image_limits",
        "internal_error",
        "log_failure",
        "merged_text",
        "model_sources",
        "render_piece",
        "scoring",
        "speaking",
        "LoraAdapters",
    ],
    "settings": [
        "ENV_PREFIX",
        "Help",
        "LOG_LEVELS",
        "ServerSettings",
        "Settings",
        "SettingsError",
        "Unit",
        "env_name",
        "flag_name",
        "repeatable",
        "setting_help",
        "shown_default",
        "takes_units",
        "value_type",
    ],
    "store": [
        "PostgresResponsesStore",
        "ResponsesStorage",
        "ResponsesStore",
        "StoreLimits",
        "StoreUnavailable",
        "StoredResponse",
        "responses_store_at",
    ],
    "testing": [
        "CancelCause",
        "LiveServer",
        "ServerReport",
        "extra_processors",
        "harness",
        "injected_fault",
        "start_server",
    ],
    "tools": [
        "CT2FormatError",
        "EOS_TOKEN",
        "GGUFConversionError",
        "PAD_TOKEN",
        "PRESETS",
        "Preset",
        "convert_ct2_whisper",
        "convert_gguf",
        "make_model",
        "write_tokenizer",
        "make_adapter",
    ],
}
"""Each package's public names: a change to a package's surface is a change to this list."""


WEB_FRAMEWORKS = ("quart", "quart_trio", "werkzeug", "hypercorn", "h11")


def test_the_serving_core_imports_no_web_framework() -> None:
    """serving/ is the runtime apart from HTTP: Quart, Werkzeug and Hypercorn stay in http/."""
    offences = [
        f"{path.relative_to(SRC)}:{line} imports {target}"
        for path in sorted((SRC / "serving").rglob("*.py"))
        for line, target in imported_modules(path.read_text(), package_of(path))
        if target.split(".")[0] in WEB_FRAMEWORKS
    ]
    assert offences == []


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_names_its_public_surface(package: str) -> None:
    module = importlib.import_module(f"mlx_nursery.{package}")
    names = list(module.__all__)
    assert len(names) == len(set(names))
    assert [name for name in names if not hasattr(module, name)] == []
    assert sorted(names) == sorted(PUBLIC[package])
