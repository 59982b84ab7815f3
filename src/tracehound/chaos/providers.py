"""The Chaos Toolkit providers: python (call a function), process (run a
program), http (call an endpoint). Each returns the activity's output or
raises ActivityFailed."""
from __future__ import annotations

import importlib
import itertools
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request


class ActivityFailed(Exception):
    pass


def run_python(p: dict):
    fn = getattr(importlib.import_module(p["module"]), p["func"])
    try:
        return fn(**(p.get("arguments") or {}))
    except Exception as exc:
        raise ActivityFailed(f"{p['module']}.{p['func']}() raised "
                             f"{type(exc).__name__}: {exc}") from exc


def process_argv(p: dict) -> tuple[list[str] | str, bool]:
    """Chaos Toolkit's rules: a string is a shell command line; a list is
    argv; a mapping is flattened to option/value pairs; empty values drop."""
    path = shutil.which(os.path.expanduser(p["path"])) or p["path"]
    args = p.get("arguments") or []
    if isinstance(args, str):
        return f"{path} {args}", True
    if isinstance(args, dict):
        args = itertools.chain.from_iterable(args.items())
    return [path] + [str(a) for a in args if a not in (None, "")], False


def run_process(p: dict) -> dict:
    argv, shell = process_argv(p)
    try:
        out = subprocess.run(argv, shell=shell, capture_output=True, timeout=p.get("timeout"),
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ActivityFailed(f"{p['path']} took longer than {p.get('timeout')} s") from None
    except OSError as exc:
        raise ActivityFailed(f"cannot run {p['path']}: {exc.strerror}") from None
    return {"status": out.returncode, "stdout": out.stdout.decode("utf-8", "replace"),
            "stderr": out.stderr.decode("utf-8", "replace")}


def run_http(p: dict) -> dict:
    method = p.get("method", "GET").upper()
    url = p["url"]
    args = p.get("arguments") or {}
    data = None
    headers = dict(p.get("headers") or {})
    if args and method == "GET":
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode(args)
    elif args:
        data = json.dumps(args).encode()
        headers.setdefault("Content-Type", "application/json")
    timeout = p.get("timeout", 30)
    if isinstance(timeout, list):
        timeout = sum(timeout)
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    ctx = None
    if url.startswith("https://") and p.get("verify_tls") is False:
        import ssl
        ctx = ssl._create_unverified_context()
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            status, rheaders, raw = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        status, rheaders, raw = exc.code, dict(exc.headers or {}), exc.read()
    except (urllib.error.URLError, OSError) as exc:
        raise ActivityFailed(f"cannot reach {url}: {getattr(exc, 'reason', exc)}") from None
    body = raw.decode("utf-8", "replace")
    if rheaders.get("Content-Type", "").startswith("application/json"):
        try:
            body = json.loads(body)
        except ValueError:
            pass
    expected = p.get("expected_status")
    if expected is not None:
        allowed = expected if isinstance(expected, list) else [expected]
        if status not in allowed:
            raise ActivityFailed(f"{method} {url} answered {status}, expected "
                                 f"{' or '.join(map(str, allowed))}")
    return {"status": status, "headers": rheaders, "body": body}


# the providers that need nothing of a run: a declared rollback can be
# replayed from the journal by `chaos recover`
GENERIC = {"python": run_python, "process": run_process, "http": run_http}
