"""The agent's overhead on page-cache I/O against bpftrace: python -m bench.overhead."""
