"""Chaos tolerances' JSON paths, chaos/jsonpath.py against jsonpath-ng: python -m bench.jsonpath."""
