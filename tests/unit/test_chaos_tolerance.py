"""Tolerances and JSONPath, with Chaos Toolkit's semantics."""
import pytest

from tracehound.chaos import jsonpath, tolerance
from tracehound.chaos.config import references, resolve, substitute

PROCESS_OK = {"status": 0, "stdout": "link is up\n", "stderr": ""}
HTTP = {"status": 200, "headers": {}, "body": {"items": [{"name": "a", "n": 1},
                                                         {"name": "b", "n": 5}]}}


@pytest.mark.parametrize("tol,value,ok", [
    (True, True, True),
    (True, False, False),
    (True, {"detected": True, "mttd_seconds": 1.2}, True),
    (False, {"detected": True}, False),
    (0, PROCESS_OK, True),
    (1, PROCESS_OK, False),
    (200, HTTP, True),
    (3, 3, True),
    (3, 3.5, False),
    (2.5, 2.5, True),
    ("up", "up", True),
    ("up", "down", False),
    ([200, 204], HTTP, True),
    ([0, 10], 7, True),
    ([0, 10], 11, False),
    ([0, 10], "7", False),
    (["a", "b", "c"], "b", True),
    ({"type": "range", "range": [1, 2]}, 1.5, True),
    ({"type": "range", "range": [1, 2]}, "1.5", True),
    ({"type": "range", "range": [1, 2]}, "many", False),
    ({"type": "range", "range": [0, 0], "target": "status"}, PROCESS_OK, True),
    ({"type": "regex", "pattern": "is up", "target": "stdout"}, PROCESS_OK, True),
    ({"type": "regex", "pattern": "^down"}, "up", False),
    ({"type": "jsonpath", "path": "$.items[*].name", "target": "body",
      "expect": ["a", "b"]}, HTTP, True),
    ({"type": "jsonpath", "path": "$.items[?(@.n > 2)].name", "target": "body",
      "expect": "b"}, HTTP, True),
    ({"type": "jsonpath", "path": "$.items[*]", "target": "body", "count": 2}, HTTP, True),
    ({"type": "jsonpath", "path": "$.items[*]", "target": "body", "count": 3}, HTTP, False),
    ({"type": "jsonpath", "path": "$.missing"}, {"a": 1}, False),
    ({"type": "jsonpath", "path": "$.a", "expect": 1}, '{"a": 1}', True),
])
def test_within(tol, value, ok):
    assert tolerance.check(tol) == []
    assert tolerance.within(tol, value) is ok


def test_probe_tolerance_gets_the_value():
    seen = []

    def run(tol, value):
        seen.append(value)
        return value > 3

    tol = {"type": "probe", "name": "x", "provider": {"type": "python", "module": "m",
                                                      "func": "f"}}
    assert tolerance.within(tol, 5, run) is True
    assert tolerance.within(tol, 1, run) is False
    assert seen == [5, 1]


@pytest.mark.parametrize("tol,fragment", [
    (None, "not null"),
    ([], "accepts nothing"),
    ([5, 1], "low bound above"),
    ({"type": "regex"}, "string 'pattern'"),
    ({"type": "regex", "pattern": "("}, "invalid regular expression"),
    ({"type": "jsonpath", "path": "items"}, "must start with $"),
    ({"type": "jsonpath", "path": "$.a[?(@.x ~ 1)]"}, "cannot read"),
    ({"type": "jsonpath", "path": "$.a", "count": -1}, "count must be"),
    ({"type": "range", "range": [1]}, "two numbers"),
    ({"type": "range", "range": [3, 1]}, "above high bound"),
    ({"type": "nope"}, "tolerance type must be one of"),
    ({"type": "regex", "pattern": "x", "target": 5}, "target must be a string"),
])
def test_bad_tolerances(tol, fragment):
    problems = tolerance.check(tol)
    assert problems and fragment in problems[0][1]


@pytest.mark.parametrize("path,doc,found", [
    ("$", {"a": 1}, [{"a": 1}]),
    ("$.a.b", {"a": {"b": 2}}, [2]),
    ("$['a']['b']", {"a": {"b": 2}}, [2]),
    ("$.a[-1]", {"a": [1, 2, 3]}, [3]),
    ("$.a[0:2]", {"a": [1, 2, 3]}, [1, 2]),
    ("$.a.*", {"a": {"x": 1, "y": 2}}, [1, 2]),
    ("$..n", {"a": [{"n": 1}, {"b": {"n": 2}}]}, [1, 2]),
    ("$.a[?(@.ok)].id", {"a": [{"id": 1, "ok": True}, {"id": 2}]}, [1]),
    ("$.a[?(@.s == 'x')].id", {"a": [{"id": 1, "s": "x"}, {"id": 2, "s": "y"}]}, [1]),
    ("$.a[?(@.n >= 2)].n", {"a": [{"n": 1}, {"n": 2}, {"n": "z"}]}, [2]),
    # a string is unequal to a number; only an order between them is undefined
    ("$.a[?(@.n != 2)].n", {"a": [{"n": 1}, {"n": 2}, {"n": "z"}]}, [1, "z"]),
    ("$.a[5]", {"a": [1]}, []),
])
def test_jsonpath(path, doc, found):
    assert jsonpath.match(path, doc) == found


def test_configuration_substitution_keeps_types(monkeypatch):
    monkeypatch.setenv("TH_TEST_RATE", "2048")
    conf = resolve({"rate": {"type": "env", "key": "TH_TEST_RATE", "default": 1},
                    "dir": {"type": "env", "key": "TH_TEST_UNSET_DIR", "default": "/tmp"},
                    "name": "job"})
    assert conf == {"rate": 2048, "dir": "/tmp", "name": "job"}
    value = {"wbps": "${rate}", "path": "${dir}/x", "list": ["${name}", 1]}
    assert substitute(value, conf) == {"wbps": 2048, "path": "/tmp/x", "list": ["job", 1]}
    assert references(value) == [("wbps", "rate"), ("path", "dir"), ("list[0]", "name")]
