"""One experiment on many nodes, through the scheduler the fleet already runs.

plan.py chooses the nodes (and refuses a blast radius that is too wide),
journal.py records every launch before it happens, launcher.py runs the
ordinary local `chaos run` on each node in waves through `srun`, watching an
abort condition, and report.py joins what every node recorded with what the
fleet's Prometheus saw per instance. kubernetes.py writes the same fan-out as
one Job per node, for a cluster this project cannot run.
"""
