"""`tracehound health`: a Slurm HealthCheckProgram over the local agent."""
