"""Checking Chaos Toolkit's providers (python, process, http), for the
activities of an experiment and for probe tolerances, which run a provider
of their own."""
from __future__ import annotations

import importlib
import inspect
import re
import shutil

from . import consent, tolerance
from .detection import QUERY_KEYS
from .document import child_path

PROVIDER_KEYS = {
    "python": ("type", "module", "func", "arguments"),
    "process": ("type", "path", "arguments", "timeout"),
    "http": ("type", "url", "method", "headers", "arguments", "timeout", "expected_status",
             "verify_tls"),
    "tracehound": ("type", "fault", "arguments", "detect", "rollback") + QUERY_KEYS,
}
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")


class ProviderChecks:
    """Mixed into schema.Checker: uses its add(), _keys(), code and notes."""

    def _tolerance_probe(self, tol, path: str, act: dict) -> None:
        """A probe tolerance runs a provider of its own: python, process or
        http (a fault or a detection there would escape the method's checks)."""
        if not (isinstance(tol, dict) and tol.get("type") == "probe"):
            return
        provider, ppath = tol.get("provider"), child_path(path, "provider")
        if not isinstance(provider, dict) or provider.get("type") not in ("python", "process",
                                                                          "http"):
            self.add(ppath, "a probe tolerance needs a provider mapping of type python, "
                            "process or http")
            return
        ptype = provider["type"]
        self._keys(provider, ppath, PROVIDER_KEYS[ptype], f"a {ptype} provider")
        getattr(self, f"_{ptype}")(provider, ppath, act, "tolerance", False)
        if ptype in consent.CODE_PROVIDERS:
            self.code.append(consent.CodeActivity(ppath, str(act.get("name")), ptype,
                                                  consent.describe(provider)))

    def _timeout(self, value, path: str, pair: bool = False) -> None:
        if value is None:
            return
        if pair and isinstance(value, list) and len(value) == 2 and all(
                tolerance.is_number(x) and x > 0 for x in value):
            return
        if not tolerance.is_number(value) or value <= 0:
            self.add(path, "timeout must be a positive number of seconds"
                     + (" (or [connect, read])" if pair else ""))

    def _python(self, p, path, act, section, hypothesis) -> None:
        module, func, args = p.get("module"), p.get("func"), p.get("arguments", {})
        if not isinstance(module, str) or not re.fullmatch(r"[A-Za-z_][\w.]*", module or ""):
            self.add(child_path(path, "module"), "module must be a dotted Python module name")
            return
        if not isinstance(func, str) or not func.isidentifier():
            self.add(child_path(path, "func"), "func must be a function name")
            return
        if not isinstance(args, dict):
            self.add(child_path(path, "arguments"), "arguments must be a mapping")
            return
        if not (self.allow_code or consent.may_import(module)):
            # importing runs the module: only located until the run is consented
            if not consent.locatable(module):
                self.add(child_path(path, "module"), f"cannot import {module}: no module "
                         f"named {module.split('.', 1)[0]}")
            else:
                self.notes.append(f"{module} is not imported before consent (importing runs "
                                  f"it): {func}() and its arguments are checked with "
                                  "--allow-code")
            return
        try:
            fn = getattr(importlib.import_module(module), func)
        except ImportError as exc:
            self.add(child_path(path, "module"), f"cannot import {module}: {exc}")
            return
        except AttributeError:
            self.add(child_path(path, "func"), f"{module} has no function {func}")
            return
        try:
            inspect.signature(fn).bind(**args)
        except TypeError as exc:
            self.add(child_path(path, "arguments"), f"arguments do not fit {func}(): {exc}")
        except ValueError:
            pass  # builtins without a signature: checked when called

    def _process(self, p, path, act, section, hypothesis) -> None:
        exe = p.get("path")
        if not isinstance(exe, str) or not exe:
            self.add(child_path(path, "path"), "a process provider needs the program in 'path'")
        elif not shutil.which(exe):
            self.add(child_path(path, "path"), f"'{exe}' is not an executable program here")
        args = p.get("arguments")
        ok = (args is None or isinstance(args, str)
              or isinstance(args, list) and all(isinstance(x, (str, int, float)) for x in args)
              or isinstance(args, dict) and all(x is None or isinstance(x, (str, int, float))
                                                for x in args.values()))
        if not ok:
            self.add(child_path(path, "arguments"), "arguments must be a string, a list of "
                     "strings or a mapping of option to value")
        self._timeout(p.get("timeout"), child_path(path, "timeout"))

    def _http(self, p, path, act, section, hypothesis) -> None:
        url = p.get("url")
        if not isinstance(url, str) or not re.match(r"https?://\S+$", url):
            self.add(child_path(path, "url"), "url must be an http:// or https:// address")
        method = p.get("method", "GET")
        if not isinstance(method, str) or method.upper() not in HTTP_METHODS:
            self.add(child_path(path, "method"), f"method must be one of {', '.join(HTTP_METHODS)}")
        headers = p.get("headers")
        if headers is not None and not (isinstance(headers, dict) and all(
                isinstance(v, str) for v in headers.values())):
            self.add(child_path(path, "headers"), "headers must map names to strings")
        if "arguments" in p and not isinstance(p["arguments"], dict):
            self.add(child_path(path, "arguments"), "arguments must be a mapping")
        self._timeout(p.get("timeout"), child_path(path, "timeout"), pair=True)
        exp = p.get("expected_status")
        codes = exp if isinstance(exp, list) else [exp]
        if exp is not None and not all(isinstance(c, int) and not isinstance(c, bool)
                                       and 100 <= c <= 599 for c in codes):
            self.add(child_path(path, "expected_status"),
                     "expected_status must be an HTTP status (100-599) or a list of them")
        if "verify_tls" in p and not isinstance(p["verify_tls"], bool):
            self.add(child_path(path, "verify_tls"), "verify_tls must be true or false")

