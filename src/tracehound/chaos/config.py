"""The experiment's `configuration` block and ${name} substitution.

A value is a literal, or {type: env, key: VAR, default: ...} read from the
environment when the experiment is loaded. A string that is exactly
"${name}" takes the value with its type (a number stays a number); inside
a longer string it is interpolated as text.

The runner gives every experiment ${run}: six hex digits of its run id, for
names that two runs on one node must not share (a cgroup, a network
namespace, an interface: 15 bytes at most). A configuration value may use
it, e.g. default: /tracehound-chaos-io-throttle-${run}.
"""
from __future__ import annotations

import os
import re

NAME = r"[A-Za-z_][A-Za-z0-9_.-]*"
REF = re.compile(rf"\$\{{({NAME})\}}")
WHOLE = re.compile(rf"^\$\{{({NAME})\}}$")


RUN = "run"


def builtins(run_id: str) -> dict:
    """What every experiment may name without configuring it."""
    return {RUN: run_id.rsplit("-", 1)[-1][:6]}


def check(block) -> list[tuple[str, str]]:
    if block is None:
        return []
    if not isinstance(block, dict):
        return [("", "configuration must be a mapping of names to values")]
    problems = []
    for key, value in block.items():
        if key == RUN:
            problems.append((key, f"'{RUN}' is the runner's: ${{{RUN}}} is this run's id, "
                                  "for names two runs must not share"))
        if not re.fullmatch(NAME, key):
            problems.append((key, f"configuration name {key!r} must be a word "
                                  "(letters, digits, _ . -)"))
        if isinstance(value, dict):
            if value.get("type") != "env":
                problems.append((key, "a configuration mapping must be "
                                      "{type: env, key: VARIABLE, default: ...}"))
                continue
            if not isinstance(value.get("key"), str) or not value["key"]:
                problems.append((key, "an env configuration needs the variable name in 'key'"))
            unknown = set(value) - {"type", "key", "default"}
            if unknown:
                problems.append((key, f"unknown field(s) {', '.join(sorted(unknown))} in an "
                                      "env configuration (type, key, default)"))
            elif value.get("key") and value["key"] not in os.environ and "default" not in value:
                problems.append((key, f"environment variable {value['key']} is not set and "
                                      "there is no default"))
    return problems


def resolve(block, given: dict | None = None) -> dict:
    """The configuration's values, with the runner's `given` ones (builtins())
    substituted into them and added."""
    given = given or {}
    out = {}
    for key, value in (block or {}).items():
        if isinstance(value, dict) and value.get("type") == "env":
            if not isinstance(value.get("key"), str):
                continue          # reported by check()
            raw = os.environ.get(value["key"])
            if raw is None:
                out[key] = value.get("default")
            else:
                out[key] = _typed_like(raw, value.get("default"))
        else:
            out[key] = value
    return {**{k: substitute(v, given) for k, v in out.items()}, **given}


def _typed_like(raw: str, default):
    """An environment value takes the default's type when it parses as one."""
    try:
        if isinstance(default, bool):
            return raw.lower() in ("1", "true", "yes", "on")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        pass
    return raw


def references(value, path: str = "") -> list[tuple[str, str]]:
    """(path, name) of every ${name} inside value."""
    out = []
    if isinstance(value, str):
        out.extend((path, m.group(1)) for m in REF.finditer(value))
    elif isinstance(value, dict):
        for k, v in value.items():
            out.extend(references(v, f"{path}.{k}" if path else k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(references(v, f"{path}[{i}]"))
    return out


def substitute(value, config: dict):
    if isinstance(value, str):
        whole = WHOLE.match(value)
        if whole and whole.group(1) in config:
            return config[whole.group(1)]
        return REF.sub(lambda m: str(config[m.group(1)]) if m.group(1) in config
                       else m.group(0), value)
    if isinstance(value, dict):
        return {k: substitute(v, config) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, config) for v in value]
    return value
