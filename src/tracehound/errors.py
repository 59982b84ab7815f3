"""Errors that reach the user as one line, never as a traceback."""


class TracehoundError(Exception):
    """A problem the user can act on; str() is the whole message."""


class SetupError(TracehoundError):
    """Something the host lacks (root, BTF, libbpf, a free port)."""


class ProbeError(TracehoundError):
    """A BPF program failed to load or attach.

    Carries which program, which hook and the kernel's reason so the message
    can say all three.
    """

    def __init__(self, program: str, hook: str, reason: str, log: str = ""):
        self.program = program
        self.hook = hook
        self.reason = reason
        self.log = log
        msg = f"program {program} on {hook}: {reason}"
        if log:
            msg += "\n" + log
        super().__init__(msg)
