"""The agent's subsystems, in start-up order: one line each."""
from .gpu import GpuSubsystem
from .io import IoSubsystem
from .rdma import RdmaSubsystem

SUBSYSTEMS = (IoSubsystem, RdmaSubsystem, GpuSubsystem)

__all__ = ["SUBSYSTEMS"]
