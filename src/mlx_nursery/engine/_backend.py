"""MLX's backend, set up in a process before a model loads: the switches MLX reads once per
process (cuDNN attention, CUDA graphs), where its run-time compiled kernels are kept, and
the bound on its cache of freed buffers; and whether it runs on CUDA (`on_cuda`). Every
process that runs a model calls these before its first MLX work on the GPU: an engine's
thread (`_startup.start_up`, `run_device_thread`) and each follower rank of a distributed
group (`distributed/`)."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import mlx.core as mx

from .. import _cuda_graphs
from ._memory import bound_buffer_cache, device_memory

log = logging.getLogger("mlx_nursery.engine")


def cuda_graphs_known_off() -> bool:
    """MLX's CUDA graphs are off in this process for certain (`mlx_nursery._cuda_graphs`)."""
    return _cuda_graphs.state.known_off


@functools.cache
def on_cuda() -> bool:
    """MLX's default device is a CUDA GPU: where the engine's kernels run."""
    if mx.default_device().type != mx.DeviceType.gpu:
        return False
    cuda = getattr(mx, "cuda", None)
    return bool(cuda is not None and cuda.is_available())


def prepare_backend(*, cudnn_attention: bool, cuda_graphs: bool) -> None:
    """MLX's backend set up as the engine serves with it, before the model loads: cuDNN
    attention and CUDA graphs on or off (`EngineConfig.cudnn_attention`, `.cuda_graphs`:
    MLX reads each once per process, at its first attention call and its first command
    buffer, so they must be set before anything runs on the GPU), compiled kernels kept
    on disk, the buffer cache bounded. Every process that serves a model calls it: the
    engine's, and each follower rank's (`distributed/`), so that all ranks run the same
    kernels. No effect on Metal or the CPU but the environment."""
    os.environ["MLX_CUDA_USE_CUDNN_SDPA"] = "1" if cudnn_attention else "0"
    _cuda_graphs.set_for_engine(cuda_graphs)
    keep_compiled_kernels()
    bound_cuda_buffer_cache()


def bound_cuda_buffer_cache() -> None:
    """MLX's cache of freed buffers limited on CUDA (`_memory.bound_buffer_cache`), before
    the model loads."""
    limit = bound_buffer_cache(on_cuda(), device_memory(mx.device_info()))
    if limit is not None:
        log.debug("MLX's buffer cache limited to %d bytes", limit)


def keep_compiled_kernels() -> None:
    """Keep the kernels MLX's CUDA backend compiles at run time (NVRTC) in this user's cache
    directory, per MLX version, unless the operator chose a place (`MLX_PTX_CACHE_DIR`).

    Why: MLX keeps them under the system's temporary directory by default, which a reboot or
    a fresh container empties; compiling them again is most of a first start's time
    (docs/decisions/0034-warm-up-runs-serving.md). MLX reads the variable at its first
    compile, so every engine thread sets it before loading; the first one decides. No effect
    on Metal or the CPU."""
    import platformdirs

    if "MLX_PTX_CACHE_DIR" in os.environ:
        return
    version = str(getattr(mx, "__version__", "unknown"))
    cache = Path(platformdirs.user_cache_dir("mlx-nursery")) / "cuda-kernels" / version
    try:  # a home that cannot be written to: MLX's own place (the temporary directory) then
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return
    os.environ["MLX_PTX_CACHE_DIR"] = str(cache)
