"""Attaching the netfault classifier with libbpf's tc API, inside a network
namespace.

The program is loaded by tracehound's own libbpf layer (no bpffs pin, no
tc object loading) and attached with bpf_tc_attach from a short-lived
thread that has joined the target namespace: setns(CLONE_NEWNET) changes
only the calling thread, so the rest of the process stays where it was.
Removal goes through the tc command, which needs nothing from this process
and therefore also works when recovering after a crash.
"""
from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading

from . import FaultError
from .targets import netns_path

CLONE_NEWNET = 0x40000000
BPF_TC_INGRESS = 1
BPF_TC_EGRESS = 2
CFG = struct.Struct("=IIQQQ")    # struct netfault_cfg in netfault.bpf.c


class TcHook(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("ifindex", ctypes.c_int),
                ("attach_point", ctypes.c_int), ("parent", ctypes.c_uint32),
                ("_pad", ctypes.c_uint32)]


class TcOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("prog_fd", ctypes.c_int),
                ("flags", ctypes.c_uint32), ("prog_id", ctypes.c_uint32),
                ("handle", ctypes.c_uint32), ("priority", ctypes.c_uint32),
                ("_pad", ctypes.c_uint32)]


def _libbpf():
    from ...bpf import libbpf
    lib = libbpf.lib()
    for name, args in (("bpf_tc_hook_create", [ctypes.POINTER(TcHook)]),
                       ("bpf_tc_attach", [ctypes.POINTER(TcHook), ctypes.POINTER(TcOpts)])):
        fn = getattr(lib, name, None)
        if fn is None:
            raise FaultError(f"libbpf lacks {name}: libbpf 0.6 or newer is needed")
        fn.restype = ctypes.c_int
        fn.argtypes = args
    return lib, libbpf


def in_netns(netns: str | None, fn):
    """fn() run on a thread inside /run/netns/<netns> (or here when None)."""
    if not netns:
        return fn()
    path = netns_path(netns)
    box: dict = {}

    def body():
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            box["error"] = FaultError(f"network namespace {netns}: {exc.strerror}")
            return
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                box["error"] = FaultError(f"setns({netns}): {os.strerror(err)}")
                return
        finally:
            os.close(fd)
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    t = threading.Thread(target=body, name=f"netns-{netns}")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


class NetfaultProgram:
    """The loaded classifier and its config/counter map."""

    def __init__(self):
        from ...bpf.loader import BpfObject
        from ...probes import object_path
        self.obj = BpfObject(object_path("netfault"))
        try:
            self.obj.load()
        except Exception:
            self.obj.close()
            raise
        self.cfg = self.obj.map("netfault_cfg")
        self.prog = self.obj.programs["netfault"]

    def configure(self, loss: float, corrupt: float) -> None:
        self.cfg.update(struct.pack("=I", 0), CFG.pack(threshold(loss), threshold(corrupt),
                                                       0, 0, 0))

    def counters(self) -> dict:
        raw = self.cfg.lookup(struct.pack("=I", 0))
        if raw is None:
            return {}
        _, _, seen, dropped, corrupted = CFG.unpack(raw)
        return {"packets_seen": seen, "packets_dropped": dropped,
                "packets_corrupted": corrupted}

    def attach(self, netns: str | None, ifname: str, direction: str, priority: int,
               handle: int) -> None:
        lib, libbpf = _libbpf()
        point = BPF_TC_EGRESS if direction == "egress" else BPF_TC_INGRESS
        prog_fd = self.prog.fd

        def attach_here():
            try:
                ifindex = socket.if_nametoindex(ifname)
            except OSError:
                raise FaultError(f"no interface {ifname}"
                                 + (f" in network namespace {netns}" if netns else "")) from None
            hook = TcHook(ctypes.sizeof(TcHook), ifindex, point, 0)
            ret = lib.bpf_tc_hook_create(ctypes.byref(hook))
            if ret < 0 and -ret != 17:  # EEXIST: clsact is already there
                raise FaultError(f"cannot add clsact qdisc on {ifname}: "
                                 + libbpf.strerror(-ret))
            opts = TcOpts(ctypes.sizeof(TcOpts), prog_fd, 0, 0, handle, priority)
            ret = lib.bpf_tc_attach(ctypes.byref(hook), ctypes.byref(opts))
            if ret < 0:
                raise FaultError(f"cannot attach the tc program to {ifname} {direction}: "
                                 + libbpf.strerror(-ret))

        in_netns(netns, attach_here)

    def close(self) -> None:
        self.obj.close()


def threshold(probability_percent: float) -> int:
    """Percent -> the 32-bit threshold the program compares prandom with."""
    p = max(0.0, min(100.0, probability_percent)) / 100.0
    return min(0xFFFFFFFF, int(round(p * 0xFFFFFFFF)))
