"""Sampled latency histograms against timing every call: python -m bench.latency_sampling."""
