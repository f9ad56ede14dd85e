"""mlx-nursery: an OpenAI-compatible inference server for MLX models on Trio."""

__version__ = "0.1.0"
