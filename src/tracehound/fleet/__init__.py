"""Working with the engines a fleet runs next to the agents (Prometheus)."""
