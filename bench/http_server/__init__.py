"""The agent's HTTP server against prometheus_client's, same registry, same run (__main__.py)."""
