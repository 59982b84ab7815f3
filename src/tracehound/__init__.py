"""tracehound: keeps GPU/HPC training fleets healthy (I/O, RDMA, GPU, chaos)."""
__version__ = "0.1.0"


def build_commit() -> str:
    """The commit the installed package was built from (written into the
    built package by setup.py), or "unknown" for a source tree."""
    try:
        from ._commit import COMMIT
    except ImportError:
        return "unknown"
    return COMMIT
