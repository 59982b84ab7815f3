"""NVML access for the GPU health collector: library loading, device reads, events."""
