"""Compiles the BPF probes (clang -target bpf) as part of building the package.

The objects are CO-RE: built once, they load on any kernel with BTF, so a
node needs no compiler, only Python and libbpf1. They are built for this
machine's architecture (its vmlinux.h and register layout for uprobes), so
the wheel says so in its platform tag (py3-none-linux_x86_64) rather than
claiming to be pure Python.
"""
import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:             # setuptools < 70.1: the wheel package's
    from wheel.bdist_wheel import bdist_wheel

PROBES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "src", "tracehound", "probes")


def source_commit() -> str:
    """The commit the package is built from (git describe), else "unknown"."""
    try:
        out = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "describe",
                              "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=30)
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


class BuildWithProbes(build_py):
    def run(self):
        try:
            subprocess.run(["make", "-C", PROBES], check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise SystemExit(f"building the BPF probes failed ({exc}): install clang, make and "
                             "libbpf-dev (apt-get install clang make libbpf-dev)")
        super().run()
        # into the built package only: tracehound_build_info says what it was built from
        with open(os.path.join(self.build_lib, "tracehound", "_commit.py"), "w") as f:
            f.write(f"COMMIT = {source_commit()!r}\n")


class ArchWheel(bdist_wheel):
    """Any Python 3, no C extension, but this architecture's BPF objects."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _python, _abi, platform = super().get_tag()
        return "py3", "none", platform


setup(cmdclass={"build_py": BuildWithProbes, "bdist_wheel": ArchWheel})
