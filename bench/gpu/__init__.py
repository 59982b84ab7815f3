"""scripts/gpu-check's driver on a machine with an NVIDIA GPU: python -m bench.gpu."""
