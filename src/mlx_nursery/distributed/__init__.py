"""Serving one model across devices (`mlx.launch`): rank 0 serves HTTP and decides; every
other rank follows its batch step for step (docs/deployment.md, "Across devices")."""

from ._launch import distributed_settings, leader, report_to, start_rank
from ._leader import Leader, MirroredStepper
from ._loading import MODES, Mode, UnsupportedModel, check_supported, supported_architectures

__all__ = [
    "MODES",
    "Leader",
    "MirroredStepper",
    "Mode",
    "UnsupportedModel",
    "check_supported",
    "distributed_settings",
    "leader",
    "report_to",
    "start_rank",
    "supported_architectures",
]
