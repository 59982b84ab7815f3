"""Per-event cost of the hook modes beside CEEMS, in the VM: python -m bench.vm_modes."""
