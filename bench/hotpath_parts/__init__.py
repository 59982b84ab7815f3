"""What each step of the I/O probe's per-event path costs: python -m bench.hotpath_parts."""
