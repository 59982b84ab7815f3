"""One Prometheus scrape's cost as cgroups and mounts grow: python -m bench.scrape."""
