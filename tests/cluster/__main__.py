"""python -m tests.cluster up|down|status [--nodes N] [--run-dir DIR]: the
one-machine Slurm cluster for hand work, benchmarks and the docs."""
import argparse
import json
import sys

from testbed.slurm import Cluster, ClusterError

DEFAULT_RUN_DIR = "/run/tracehound-slurm"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/slurm-cluster")
    p.add_argument("action", choices=("up", "down", "status"))
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--run-dir", default=DEFAULT_RUN_DIR)
    p.add_argument("--health-program", metavar="PATH",
                   help="the nodes' HealthCheckProgram (absolute path)")
    p.add_argument("--health-interval", type=int, default=2, metavar="SECONDS")
    a = p.parse_args(argv)
    cluster = Cluster(a.run_dir, a.nodes, health_program=a.health_program,
                      health_interval=a.health_interval)
    try:
        if a.action == "up":
            seconds = cluster.up()
            print(f"slurm-cluster: {len(cluster.nodes)} nodes idle in {seconds:.1f} s; "
                  f"export SLURM_CONF={cluster.conf}")
        elif a.action == "down":
            cluster.down()
            print("slurm-cluster: down")
        else:
            if not cluster.state:
                print("slurm-cluster: not running")
                return 1
            print(json.dumps({"conf": cluster.conf, "daemons": cluster.running(),
                              "nodes": {n: (i["State"], i["Flags"], i.get("Reason", ""))
                                        for n, i in cluster.node_info().items()}}, indent=1))
    except ClusterError as exc:
        print(f"slurm-cluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
