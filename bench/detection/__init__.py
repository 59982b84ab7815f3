"""How fast tracehound sees each fault of the chaos catalog: python -m bench.detection."""
