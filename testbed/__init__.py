"""Real systems that tests and benchmarks both start: a Prometheus, a Slurm
cluster and its network, one agent per node, cgroups to run in, a busy
node's workload mix, the Debian VM. Imports neither tests nor bench."""
