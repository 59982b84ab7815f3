"""tracehound: keeps GPU/HPC training fleets healthy (I/O, RDMA, GPU, chaos)."""
__version__ = "0.1.0"
