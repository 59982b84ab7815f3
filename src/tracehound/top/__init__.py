"""`tracehound top`: a live, sortable per-workload view of an agent's metrics.

Data flows one way: a source (an agent's /metrics, or a Prometheus server)
produces a Snapshot of rows (model.py); the view renders it with rich; the
command line drives either a live terminal loop or a single snapshot.
"""
