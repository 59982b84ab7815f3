"""Compiles the BPF probes (clang -target bpf) as part of building the package."""
import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

PROBES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "src", "tracehound", "probes")


class BuildWithProbes(build_py):
    def run(self):
        try:
            subprocess.run(["make", "-C", PROBES], check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise SystemExit(f"building the BPF probes failed ({exc}): install clang, make and "
                             "libbpf-dev (apt-get install clang make libbpf-dev)")
        super().run()


setup(cmdclass={"build_py": BuildWithProbes})
