"""The engine's parts that a stepper built outside it stands on: the `Stepper` protocol and
the batch stepper it wraps, sequences and their samplers, KV cache factories and the memory
arithmetic, MLX's generation stream, the backend's set-up and the attention's routing.
`distributed/` mirrors the batch across devices with them; nothing else outside the engine
needs them."""

from ._backend import prepare_backend
from ._decode_attention import install as install_attention
from ._kv_quant import CacheFactory, KVQuantization, cache_factory, check_quantizable
from ._memory import derive_kv_bytes, device_memory, kv_bytes_per_token
from ._sampling import Sampler, sample_batch
from ._sequence import LiveSequence, Response
from ._stepper import BatchStepper, KVState, Start, Stepper
from ._upstream import generation_stream

__all__ = [
    "BatchStepper",
    "CacheFactory",
    "KVQuantization",
    "KVState",
    "LiveSequence",
    "Response",
    "Sampler",
    "Start",
    "Stepper",
    "cache_factory",
    "check_quantizable",
    "derive_kv_bytes",
    "device_memory",
    "generation_stream",
    "install_attention",
    "kv_bytes_per_token",
    "prepare_backend",
    "sample_batch",
]
