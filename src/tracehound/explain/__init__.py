"""`tracehound explain JOB`: what is wrong with one job, ranked, across its nodes.

rules.py says what counts as wrong (data: the signal, its PromQL over a
window, how bad, what to do); fleet.py asks the fleet's Prometheus every
rule for the job's nodes and ranks what holds; render.py prints it.
"""
