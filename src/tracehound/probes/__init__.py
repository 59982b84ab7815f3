"""BPF probes: C sources compiled to *.bpf.o objects, and their Python loaders."""
import os

PROBE_DIR = os.path.dirname(__file__)


def object_path(name: str) -> str:
    return os.path.join(PROBE_DIR, f"{name}.bpf.o")
