"""Checks run before loading anything, each failing with one actionable line."""
from __future__ import annotations

import os

from .bpf import libbpf
from .errors import SetupError

BTF_PATH = os.environ.get("TRACEHOUND_BTF", "/sys/kernel/btf/vmlinux")


def check_root() -> None:
    if os.geteuid() != 0:
        raise SetupError("tracehound needs root to load BPF programs: run it with sudo "
                         "(or as a privileged DaemonSet)")


def check_btf() -> None:
    if not os.path.exists(BTF_PATH):
        raise SetupError(f"this kernel has no BTF ({BTF_PATH} missing): tracehound's CO-RE "
                         "probes need a kernel built with CONFIG_DEBUG_INFO_BTF=y")


def check_libbpf() -> None:
    libbpf.lib()


def run_all() -> None:
    check_root()
    check_libbpf()
    check_btf()
