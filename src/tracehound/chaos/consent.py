"""Activities that run code of the experiment's choosing.

Chaos Toolkit's `python` provider calls any function of any importable module
and its `process` provider runs any program (a string of arguments goes
through the shell); a detection or query probe with `source: process` runs
its command at every reading; gpu.nccl launches the job it is given. Run as
root, each is arbitrary code as root, so `chaos validate` lists them and
`chaos run` runs them only with --allow-code. Importing a module runs its top-level code
too: before consent, validation imports only modules already loaded and
tracehound's own, and merely locates the others.
"""
from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from dataclasses import dataclass

from ..printable import escaped
from .providers import process_argv

CODE_PROVIDERS = ("python", "process")
MAX_SHOWN = 200          # characters of one command line in a listing


@dataclass(frozen=True)
class CodeActivity:
    path: str            # method[0].provider
    name: str            # the activity's name
    kind: str            # python, process, or the fault that launches a program
    what: str            # module.function(arguments) or the command line

    def line(self) -> str:
        return f"{self.path} '{printable(self.name)}': {self.kind} {printable(self.what)}"


def printable(text: str) -> str:
    """Control characters escaped (a listing must not drive the terminal),
    long values cut."""
    out = escaped(str(text))
    return out if len(out) <= MAX_SHOWN else out[:MAX_SHOWN] + "..."


def describe(provider: dict) -> str:
    if provider.get("type") == "python":
        args = provider.get("arguments") or {}
        shown = ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in args.items()) \
            if isinstance(args, dict) else ""
        return f"{provider.get('module')}.{provider.get('func')}({shown})"
    try:
        argv, shell = process_argv(provider)
    except (TypeError, AttributeError, KeyError):
        return str(provider.get("path"))
    return argv if shell else shlex.join(argv)


def command_line(argv) -> str:
    if isinstance(argv, list):
        return shlex.join(str(x) for x in argv)
    return str(argv)


def may_import(module: str) -> bool:
    """Whether validation may import module before consent: importing runs it
    (a __main__ module runs a whole program)."""
    if "__main__" in module.split("."):
        return False
    return module in sys.modules or module == "tracehound" or module.startswith("tracehound.")


def locatable(module: str) -> bool:
    """Whether the module's top-level package exists, found without running it."""
    try:
        return importlib.util.find_spec(module.split(".", 1)[0]) is not None
    except (ImportError, ValueError):
        return False
