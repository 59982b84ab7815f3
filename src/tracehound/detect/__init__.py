"""Rules over collected state that emit anomaly events and counters."""
