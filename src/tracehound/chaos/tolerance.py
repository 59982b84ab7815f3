"""Steady-state tolerances, as Chaos Toolkit defines them: an exact value
(bool, number, string), a [low, high] range or a list of accepted values,
or a mapping of type regex, jsonpath, range or probe. A process or HTTP
result ({"status": ...}) is judged on its status by number and list
tolerances; a detection result on `detected` by a boolean one."""
from __future__ import annotations

import json
import numbers
import re
from decimal import Decimal, InvalidOperation

from . import jsonpath

TOLERANCE_TYPES = ("regex", "jsonpath", "range", "probe")


def is_number(x) -> bool:
    """A number, not a bool (which Python counts as an int)."""
    return isinstance(x, numbers.Number) and not isinstance(x, bool)


def check(tol) -> list[tuple[str, str]]:
    """(sub-path, problem) for a tolerance that cannot be evaluated."""
    if isinstance(tol, (bool, str)) or is_number(tol):
        return []
    if isinstance(tol, list):
        if not tol:
            return [("", "an empty list accepts nothing")]
        if len(tol) == 2 and all(is_number(x) for x in tol) and tol[0] > tol[1]:
            return [("", f"range [{tol[0]}, {tol[1]}] has its low bound above its high bound")]
        if any(isinstance(x, (dict, list)) for x in tol):
            return [("", "a list tolerance holds plain values only")]
        return []
    if not isinstance(tol, dict):
        return [("", "a tolerance is a boolean, number, string, list or mapping, not "
                     + ("null" if tol is None else type(tol).__name__))]
    kind = tol.get("type")
    if kind not in TOLERANCE_TYPES:
        return [("type", f"tolerance type must be one of {', '.join(TOLERANCE_TYPES)}, "
                         f"not {kind!r}")]
    problems = []
    target = tol.get("target")
    if target is not None and not isinstance(target, str):
        problems.append(("target", "target must be a string (e.g. stdout, body, status)"))
    if kind == "regex":
        pattern = tol.get("pattern")
        if not isinstance(pattern, str):
            problems.append(("pattern", "a regex tolerance needs a string 'pattern'"))
        else:
            try:
                re.compile(pattern)
            except re.error as exc:
                problems.append(("pattern", f"invalid regular expression: {exc}"))
    elif kind == "jsonpath":
        try:
            jsonpath.parse(tol.get("path"))
        except jsonpath.JsonPathError as exc:
            problems.append(("path", str(exc)))
        count = tol.get("count")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool)
                                  or count < 0):
            problems.append(("count", "count must be a whole number >= 0"))
    elif kind == "range":
        rng = tol.get("range")
        if not (isinstance(rng, list) and len(rng) == 2 and all(is_number(x) for x in rng)):
            problems.append(("range", "range must be a list of two numbers [low, high]"))
        elif rng[0] > rng[1]:
            problems.append(("range", f"low bound {rng[0]} is above high bound {rng[1]}"))
    return problems


def _target(value, tol: dict):
    target = tol.get("target")
    if target and isinstance(value, dict):
        return value.get(target, value)
    return value


def within(tol, value, run_probe=None) -> bool:
    """Whether a probe's output meets its tolerance. run_probe(activity,
    value) runs a probe tolerance with the output as its `value` argument."""
    if isinstance(tol, bool):
        if isinstance(value, dict) and "detected" in value:
            return value["detected"] is tol
        return value is tol or value == tol and isinstance(value, bool)
    if is_number(tol):
        if isinstance(value, dict) and "status" in value:
            return value["status"] == tol
        return is_number(value) and value == tol
    if isinstance(tol, str):
        return value == tol
    if isinstance(tol, list):
        if isinstance(value, dict) and "status" in value:
            return value["status"] in tol
        if len(tol) == 2 and all(is_number(x) for x in tol):
            return is_number(value) and tol[0] <= value <= tol[1]
        return value in tol
    kind = tol["type"]
    if kind == "probe":
        if run_probe is None:
            return False
        return bool(run_probe(tol, value))
    value = _target(value, tol)
    if kind == "regex":
        if not isinstance(value, str):
            value = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        return re.search(tol["pattern"], value) is not None
    if kind == "range":
        try:
            number = Decimal(str(value))
        except (InvalidOperation, ValueError):
            return False
        low, high = tol["range"]
        return Decimal(str(low)) <= number <= Decimal(str(high))
    # jsonpath
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            pass
    found = jsonpath.match(tol["path"], value)
    ok = len(found) > 0
    if tol.get("count") is not None:
        ok = len(found) == tol["count"]
    if "expect" in tol:
        expect = tol["expect"]
        ok = found == (expect if isinstance(expect, list) else [expect])
    return ok
