"""explain on a healthy fleet, then faults: python -m bench.explain."""
