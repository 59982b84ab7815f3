"""The I/O byte counters over time against fio's own: python -m bench.accuracy."""
