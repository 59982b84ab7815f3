"""The agent's subsystems, in start-up order: one line each. stall reads what
the others publish on the progress board, so it comes last."""
from .exits import ExitsSubsystem
from .gpu import GpuSubsystem
from .io import IoSubsystem
from .net import NetSubsystem
from .pressure import PressureSubsystem
from .rdma import RdmaSubsystem
from .stall import StallSubsystem

SUBSYSTEMS = (IoSubsystem, RdmaSubsystem, GpuSubsystem, NetSubsystem, ExitsSubsystem,
              PressureSubsystem, StallSubsystem)

__all__ = ["SUBSYSTEMS"]
