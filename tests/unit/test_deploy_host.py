"""The systemd unit and the image recipe under deploy/: the agent they start,
the capabilities and namespaces the unit gives it, and that the recipe copies
what exists."""
import os
import subprocess
import sys

from tests.conftest import ROOT
from tests.unit.test_deploy_manifests import DEPLOY, run_parser

UNIT = os.path.join(DEPLOY, "systemd", "tracehound.service")
# systemd options that give the service its own mount namespace (other mount ids)
MOUNT_NAMESPACE_OPTIONS = ("PrivateTmp", "PrivateDevices", "PrivateMounts", "ProtectSystem",
                           "ProtectHome", "ProtectKernelTunables", "ProtectKernelModules",
                           "ProtectKernelLogs", "ProtectControlGroups", "ProtectClock",
                           "ProtectHostname", "ReadOnlyPaths", "InaccessiblePaths",
                           "TemporaryFileSystem", "BindPaths", "RootDirectory")
CAPABILITIES = {"CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN", "CAP_SYS_RESOURCE",
                "CAP_DAC_READ_SEARCH", "CAP_SYSLOG"}


def unit_options():
    options = {}
    section = None
    with open(UNIT) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                section = line.strip("[]")
                continue
            key, _, value = line.partition("=")
            options.setdefault((section, key), []).append(value)
    return options


def test_systemd_unit_runs_the_agent_with_bpf_capabilities_only():
    options = unit_options()
    (exec_start,) = options[("Service", "ExecStart")]
    argv = exec_start.split()
    assert argv[0].endswith("/tracehound") and argv[1] == "run"
    _, run = run_parser()
    flags = {opt for action in run._actions for opt in action.option_strings}
    assert [a for a in argv[2:] if a.startswith("-") and a not in flags] == []
    assert options[("Service", "Restart")] == ["on-failure"]
    (caps,) = options[("Service", "CapabilityBoundingSet")]
    assert set(caps.split()) == CAPABILITIES
    for option in MOUNT_NAMESPACE_OPTIONS:
        assert ("Service", option) not in options, f"{option} hides the host's mount ids"
    assert options[("Install", "WantedBy")] == ["multi-user.target"]


def test_systemd_unit_verifies(tmp_path):
    # verify also checks that ExecStart exists: point it at this environment's agent
    agent = os.path.join(os.path.dirname(sys.executable), "tracehound")
    with open(UNIT) as f:
        text = f.read().replace("/opt/tracehound/.venv/bin/tracehound", agent)
    unit = tmp_path / "tracehound.service"
    unit.write_text(text)
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and "tracehound.service" not in res.stderr, res.stderr


def test_image_recipe_copies_existing_paths():
    """Every COPY source is in the repository, or is the wheel its header's
    `pip wheel ... -w dist .` writes (its name as this version's wheel has it)."""
    import fnmatch
    import sysconfig

    import tracehound
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    wheel = f"dist/tracehound-{tracehound.__version__}-py3-none-{platform}.whl"
    with open(os.path.join(DEPLOY, "image", "Dockerfile")) as f:
        text = f.read()
    assert "pip wheel --no-build-isolation --no-deps -w dist ." in text
    copies = [line.split() for line in text.splitlines() if line.startswith("COPY ")]
    assert copies
    for words in copies:
        if any(w.startswith("--from") for w in words):
            continue
        for source in words[1:-1]:
            assert (fnmatch.fnmatch(wheel, source) if source.startswith("dist/")
                    else os.path.exists(os.path.join(ROOT, source))), source
