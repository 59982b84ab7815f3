"""What the RDMA probe adds to control-path verbs, in the VM: python -m bench.rdma_verbs."""
