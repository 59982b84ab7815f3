"""Run inside the VM by test_vm_io.py, never collected on its own (no test_
prefix in the file name): a probe that cannot load must reach the host's
pytest as a failure that names the program, the hook and the kernel's reason.
This test is meant to fail."""
from tracehound.bpf.loader import BpfObject
from tracehound.probes import object_path

MISSING = "tracehound_no_such_function"


def test_fentry_on_a_missing_function():
    with BpfObject(object_path("io")) as obj:
        for name, prog in obj.programs.items():
            prog.autoload = name == "fe_vfs_read"
        obj.programs["fe_vfs_read"].set_attach_target(MISSING)
        obj.load()
        obj.attach_all()
