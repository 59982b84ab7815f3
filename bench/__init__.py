"""Benchmarks of tracehound, one package per benchmark: python -m bench.NAME."""
