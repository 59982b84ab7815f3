"""The exporter under clients that read slowly or not at all: python -m bench.slow_clients."""
