"""Map kernel cgroup ids to the workloads they belong to."""
