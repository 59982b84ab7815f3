"""HTTP clients of what runs beside the agents: Prometheus's API, and an
agent's own URL over https with a password."""
