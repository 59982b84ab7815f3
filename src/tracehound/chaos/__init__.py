"""The chaos engine: Chaos Toolkit-compatible experiments, tracehound's fault
catalog, and detection probes that measure whether (and how fast) the
observability stack saw each fault."""
