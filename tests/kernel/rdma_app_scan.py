"""The RDMA probe's start-time scan for libibverbs, run as the agent runs it
(RdmaProbe._attach_app_view) with the application programs loaded and
attached for real (this host has no RDMA core for the others); prints what
it attached and refused as JSON. See test_rdma_app_scan.py."""
import json

from tracehound.probes.rdma import RdmaProbe, RdmaProbeConfig


def main() -> None:
    probe = RdmaProbe(RdmaProbeConfig())
    probe._load_and_attach_once([], True)
    try:
        probe._attach_app_view()
        print(json.dumps({"libraries": probe.app_libraries(), "links": len(probe.obj.links),
                          "refused": sorted(probe.app.refused.values()),
                          "unsettled": sorted(c.name for c in probe.app_unsettled())}),
              flush=True)
    finally:
        probe.close()


if __name__ == "__main__":
    main()
