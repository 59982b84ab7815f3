"""What the net subsystem adds to connects and to a lossy transfer: python -m bench.net_cost."""
