"""mlx-nursery: an OpenAI-compatible inference server for MLX models on Trio."""

from . import _cuda_graphs

_cuda_graphs.default_off()  # before anything of this package can run MLX (the module says why)

__version__ = "0.1.0"
