"""explain on the faults only the VM makes (python -m bench.explain_vm)."""
