"""What a cgroup belongs to, as one fixed set of metric labels.

Every metric family carries all of WORKLOAD_LABELS, in this order, with an
empty string where a label does not apply, so series of different workload
kinds can be aggregated together in PromQL and the label set never depends on
what happens to run on a node.
"""
from __future__ import annotations

from dataclasses import dataclass

WORKLOAD_LABELS = ("workload", "job_id", "step", "task", "namespace", "pod", "container", "vm", "unit")

SLURM = "slurm"
KUBERNETES = "kubernetes"
VM = "vm"
SYSTEMD = "systemd"
# what a scheduler started (a job, a pod, a VM), as opposed to a service
SCHEDULED = (SLURM, KUBERNETES, VM)


@dataclass(frozen=True)
class Workload:
    kind: str = ""          # exported as the "workload" label: slurm | kubernetes | vm | systemd | ""
    job_id: str = ""
    step: str = ""
    task: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""
    vm: str = ""
    unit: str = ""

    def values(self) -> tuple[str, ...]:
        """Label values in WORKLOAD_LABELS order."""
        return (self.kind, self.job_id, self.step, self.task, self.namespace,
                self.pod, self.container, self.vm, self.unit)

    def as_dict(self) -> dict[str, str]:
        return dict(zip(WORKLOAD_LABELS, self.values()))


UNATTRIBUTED = Workload()
