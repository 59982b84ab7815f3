"""False alarms on a busy, healthy node: python -m bench.soak."""
