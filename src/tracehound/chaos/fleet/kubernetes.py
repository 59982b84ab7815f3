"""The same fan-out on Kubernetes, on paper: one Job per node.

`tracehound chaos run EXPERIMENT --kubernetes --nodes a,b --dry-run` writes
a ConfigMap holding the experiment and one Job per node (pinned to it by
node affinity, privileged, host PID and network, the node's /sys/fs/cgroup
and journal directory mounted) to stdout; without --dry-run they go to
`kubectl apply -f -`. No API
server runs where tracehound is tested, so these manifests are checked for
their structure only, never applied: treat them as a starting point.
"""
from __future__ import annotations

import os
import re

import yaml

from .journal import check_node

_DNS = re.compile(r"[^a-z0-9-]+")


def _dns_name(text: str, limit: int = 63) -> str:
    return _DNS.sub("-", text.lower()).strip("-")[:limit].rstrip("-") or "x"


def manifests(experiment_text: str, experiment_name: str, nodes: list[str], image: str,
              run_id: str, allow_code: bool, namespace: str = "tracehound") -> list[dict]:
    base = _dns_name(f"tracehound-chaos-{run_id}", 48)
    config = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": base, "namespace": namespace,
                           "labels": {"app.kubernetes.io/name": "tracehound-chaos",
                                      "tracehound.io/fleet-run": _dns_name(run_id)}},
              "data": {experiment_name: experiment_text}}
    docs = [config]
    for node in nodes:
        check_node(node)
        command = ["tracehound", "chaos", "run", f"/experiment/{experiment_name}", "--yes",
                   "--journal", f"/var/lib/tracehound/chaos/fleet/{run_id}/{node}",
                   "--report", f"/var/lib/tracehound/chaos-reports/{run_id}/{node}", "--no-plot"]
        if allow_code:
            command.append("--allow-code")
        docs.append({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": _dns_name(f"{base}-{node}"), "namespace": namespace,
                         "labels": {**config["metadata"]["labels"], "tracehound.io/node": node}},
            "spec": {
                "backoffLimit": 0, "ttlSecondsAfterFinished": 86400,
                "template": {
                    "metadata": {"labels": {"app.kubernetes.io/name": "tracehound-chaos"}},
                    "spec": {
                        "restartPolicy": "Never", "hostPID": True, "hostNetwork": True,
                        "affinity": {"nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [{"matchExpressions": [{
                                    "key": "kubernetes.io/hostname", "operator": "In",
                                    "values": [node]}]}]}}},
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [{
                            "name": "chaos", "image": image, "command": command,
                            "securityContext": {"privileged": True},
                            "env": [{"name": "TRACEHOUND_METRICS_URL",
                                     "value": "http://127.0.0.1:9560/metrics"}],
                            "volumeMounts": [
                                {"name": "experiment", "mountPath": "/experiment",
                                 "readOnly": True},
                                {"name": "cgroup", "mountPath": "/sys/fs/cgroup"},
                                {"name": "state", "mountPath": "/var/lib/tracehound"}]}],
                        "volumes": [
                            {"name": "experiment", "configMap": {"name": base}},
                            {"name": "cgroup", "hostPath": {"path": "/sys/fs/cgroup"}},
                            {"name": "state", "hostPath": {"path": "/var/lib/tracehound",
                                                           "type": "DirectoryOrCreate"}}]}}}})
    return docs


def cmd_run(args, experiment: str, dry: bool, out, err) -> int:
    """A dry run prints the manifests; otherwise they go to `kubectl apply`."""
    import shutil
    import subprocess
    from ..journal import new_run_id
    if args.nodes is None:
        err("tracehound: chaos run: --kubernetes needs --nodes (the node names to pin a Job "
            "to); selection by share or job is Slurm's here")
        return 2
    nodes = [n for n in args.nodes.split(",") if n]
    try:
        with open(experiment) as f:
            text = f.read()
        docs = manifests(text, os.path.basename(experiment), nodes, args.image, new_run_id(),
                         args.allow_code)
    except (OSError, ValueError) as exc:
        err(f"tracehound: chaos run: {exc}")
        return 1
    body = yaml.safe_dump_all(docs, sort_keys=False).rstrip()
    if dry:
        out("# tracehound chaos: one Job per node; untested (no Kubernetes API server where "
            "tracehound is tested). Apply with: kubectl apply -f -")
        out(body)
        return 0
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        err("tracehound: chaos run: kubectl not found: --dry-run prints the Jobs to apply "
            "yourself; nothing was applied")
        return 1
    done = subprocess.run([kubectl, "apply", "-f", "-"], input=body + "\n", text=True,
                          capture_output=True, timeout=120)
    (out if done.returncode == 0 else err)((done.stdout + done.stderr).strip())
    return 0 if done.returncode == 0 else 1
