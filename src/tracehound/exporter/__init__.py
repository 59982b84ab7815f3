"""Prometheus / OpenMetrics exporter."""
