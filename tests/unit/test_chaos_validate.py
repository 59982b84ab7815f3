"""Malformed experiments: each is refused with a clear message (field path,
line where the loader knows it, why) and nothing is prepared, applied,
journaled or reported."""
import json
import os
import textwrap

import pytest

from tracehound import cli
from tracehound.chaos.document import MAX_FILE_BYTES

VALID = """\
title: valid base
description: a valid experiment the cases below break one way each
configuration:
  dir: /tmp
steady-state-hypothesis:
  title: always true
  probes:
    - type: probe
      name: true-works
      tolerance: 0
      provider: {type: process, path: "true"}
method:
  - type: action
    name: fill
    provider:
      type: tracehound
      fault: io.fill
      arguments: {path: "${dir}", free_bytes: 0}
  - type: probe
    name: see-it
    provider:
      type: tracehound
      detect: {timeout: 1}
rollbacks:
  - type: action
    name: say-done
    provider: {type: process, path: "true"}
"""


def method(*activities: str) -> str:
    """The valid base with its method replaced."""
    head = VALID.split("method:")[0]
    body = "".join(textwrap.indent(textwrap.dedent(a).strip() + "\n", "  ") for a in activities)
    return head + "method:\n" + body


FILL = """
- type: action
  name: fill
  provider: {type: tracehound, fault: io.fill, arguments: {path: /tmp, free_bytes: 0}}
"""


def fault(name: str, args: str, act_name: str = "f", kind: str = "action") -> str:
    return f"""
    - type: {kind}
      name: {act_name}
      provider: {{type: tracehound, fault: {name}, arguments: {args}}}
    """


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8))

# (id, file content, expected message fragment, text on the line the message must
# point at, or None where no line is known)
CASES = [
    ("empty", "", "the file is empty", None),
    ("only-comment", "# nothing here\n", "holds no document", None),
    ("top-list", "- a\n- b\n", "an experiment is a mapping", None),
    ("top-scalar", "just words\n", "an experiment is a mapping", None),
    ("unclosed-flow", "title: x\nmethod: [a, b\n", "invalid YAML", None),
    ("bad-indent", "title: x\n  description: y\n method: []\n", "invalid YAML",
     "description: y"),
    ("two-documents", VALID + "---\ntitle: again\n", "several YAML documents", "title: again"),
    ("yaml-bomb", BOMB, "alias expansion", None),
    ("recursive-alias", "title: &t [*t]\n", "nesting deeper", None),
    ("huge", "title: x\ndescription: '" + "y" * (MAX_FILE_BYTES + 10) + "'\n",
     "limited to", None),
    ("duplicate-key", VALID.replace("title: valid base", "title: a\ntitle: b"),
     "duplicate key 'title'", "title: b"),
    ("python-tag", VALID.replace("title: valid base", "title: !!python/object:os.system x"),
     "cannot read value", "!!python"),
    ("python-tag-on-mapping", VALID.replace("configuration:\n",
                                            "configuration: !!python/object:os.Popen\n"),
     "is not supported in experiments", "!!python/object:os.Popen"),
    ("timestamp", VALID.replace("title: valid base", "title: 2024-01-01 10:00:00"),
     "quote the value", "2024-01-01"),
    ("merge-key", VALID.replace("configuration:\n", "configuration:\n  <<: {a: 1}\n"),
     "merge keys", "<<"),
    ("json-syntax", '{"title": "x",\n "method": [1,]}', "invalid JSON", '"method"'),
    ("json-duplicate", '{"title": "x", "title": "y"}', "duplicate key 'title'", None),
    ("missing-title", VALID.replace("title: valid base\n", ""), "'title' is missing", None),
    ("missing-description", VALID.replace("description: a valid experiment the cases below "
                                          "break one way each\n", ""),
     "'description' is missing", None),
    ("title-list", VALID.replace("title: valid base", "title: [a, b]"),
     "'title' must be a non-empty string", "title: [a, b]"),
    ("missing-method", VALID.split("method:")[0], "'method' is missing", None),
    ("empty-method", VALID.split("method:")[0] + "method: []\n", "at least one activity",
     "method: []"),
    ("method-mapping", VALID.split("method:")[0] + "method: {a: 1}\n", "must be a list",
     "method: {a: 1}"),
    ("typo-rollbacks", VALID.replace("rollbacks:", "rollback:"), "did you mean 'rollbacks'",
     "rollback:"),
    ("secrets", VALID + "secrets: {}\n", "secrets are not supported", "secrets:"),
    ("activity-string", method("- just a string"), "an activity must be a mapping",
     "just a string"),
    ("activity-type", method(FILL.replace("type: action", "type: acton")),
     "must be probe or action", "type: acton"),
    ("activity-no-name", method(FILL.replace("  name: fill\n", "")), "non-empty string name",
     "- type: action"),
    ("activity-no-provider", method("- {type: action, name: x}"), "needs a provider",
     "name: x"),
    ("provider-typo", method("- {type: action, name: x, provider: {type: pyhton}}"),
     "did you mean 'python'", "pyhton"),
    ("activity-field-typo", method(FILL.replace("provider:", "provder:")),
     "did you mean 'provider'", "provder:"),
    ("pause-negative", method(FILL + "  pauses: {after: -1}"), "between 0 and 3600",
     "after: -1"),
    ("pause-not-mapping", method(FILL + "  pauses: 5"), "pauses must be a mapping",
     "pauses: 5"),
    ("background-string", method(FILL.replace("name: fill", "name: fill\n  background: yes-"
                                              "please")), "background must be true or false",
     "background:"),
    ("hypothesis-no-tolerance", VALID.replace("      tolerance: 0\n", ""),
     "needs a tolerance", "- type: probe"),
    ("hypothesis-action", VALID.replace("    - type: probe\n      name: true-works",
                                        "    - type: action\n      name: true-works"),
     "must be probes", "- type: action"),
    ("hypothesis-no-title", VALID.replace("  title: always true\n", ""),
     "needs a non-empty title", "steady-state-hypothesis:"),
    ("tolerance-null", VALID.replace("tolerance: 0", "tolerance: null"),
     "a tolerance is a boolean", "tolerance: null"),
    ("tolerance-regex", VALID.replace("tolerance: 0", "tolerance: {type: regex, pattern: "
                                                      "'(unclosed'}"),
     "invalid regular expression", "(unclosed"),
    ("tolerance-jsonpath", VALID.replace("tolerance: 0", "tolerance: {type: jsonpath, "
                                                         "path: 'status'}"),
     "must start with $", "jsonpath"),
    ("tolerance-range-reversed", VALID.replace("tolerance: 0", "tolerance: [10, 1]"),
     "low bound above its high bound", "[10, 1]"),
    ("tolerance-unknown-type", VALID.replace("tolerance: 0", "tolerance: {type: fuzzy}"),
     "tolerance type must be one of", "fuzzy"),
    ("tolerance-range-words", VALID.replace("tolerance: 0", "tolerance: {type: range, "
                                                            "range: [low, high]}"),
     "two numbers", "range: [low, high]"),
    ("process-no-path", VALID.replace('provider: {type: process, path: "true"}\nmethod',
                                      "provider: {type: process}\nmethod"),
     "needs the program in 'path'", "{type: process}"),
    ("process-missing-program", VALID.replace('path: "true"}\nmethod',
                                              'path: no-such-program-xyz}\nmethod'),
     "not an executable program", "no-such-program-xyz"),
    ("process-timeout", VALID.replace('path: "true"}\nmethod',
                                      'path: "true", timeout: -3}\nmethod'),
     "timeout must be a positive number", "timeout: -3"),
    ("http-url", method(FILL, "- {type: probe, name: h, provider: {type: http, url: "
                              "'ftp://x'}}"), "http:// or https://", "ftp://x"),
    ("http-method", method(FILL, "- {type: probe, name: h, provider: {type: http, url: "
                                 "'http://x', method: FETCH}}"), "method must be one of",
     "FETCH"),
    ("http-status", method(FILL, "- {type: probe, name: h, provider: {type: http, url: "
                                 "'http://x', expected_status: 999}}"),
     "expected_status must be", "999"),
    ("python-module-shape", method("- {type: action, name: p, provider: {type: python, "
                                   "module: 'no such', func: f}}"),
     "dotted Python module name", "no such"),
    ("python-not-importable", method("- {type: action, name: p, provider: {type: python, "
                                     "module: no_such_module_xyz, func: f}}"),
     "cannot import no_such_module_xyz", "no_such_module_xyz"),
    ("python-no-func", method("- {type: action, name: p, provider: {type: python, module: "
                              "os.path, func: no_such_func}}"), "has no function",
     "no_such_func"),
    ("python-bad-arguments", method("- {type: action, name: p, provider: {type: python, "
                                    "module: os.path, func: exists, arguments: {nope: 1}}}"),
     "arguments do not fit exists()", "nope: 1"),
    ("unknown-fault", method(fault("io.throttel", "{}")), "did you mean 'io.throttle'",
     "io.throttel"),
    ("fault-missing-arg", method(fault("net.loss", "{percent: 5}")),
     "needs argument 'interface'", "net.loss"),
    ("fault-arg-type", method(fault("io.throttle", "{cgroup: /x, device: /dev/vda, wbps: "
                                    "fast}")), "must be an integer", "wbps: fast"),
    ("fault-unknown-arg", method(fault("proc.stop", "{pid: 123, colour: red}")),
     "takes no argument 'colour'", "colour: red"),
    ("fault-arg-range", method(fault("net.loss", "{interface: x, netns: n, percent: 150}")),
     "at most 100", "percent: 150"),
    ("fault-two-targets", method(fault("proc.kill", "{pid: 123, name: sleep}")),
     "exactly one target", "proc.kill"),
    ("fault-root-cgroup", method(fault("proc.stress", "{cgroup: /}")),
     "root cgroup holds every process", "proc.stress"),
    ("fill-both-levels", method(fault("io.fill", "{path: /tmp, free_bytes: 1, "
                                      "free_percent: 5}")), "exactly one of free_bytes",
     "free_percent: 5"),
    ("delay-bpf", method(fault("net.delay", "{interface: x, netns: n, delay_ms: 5, "
                                "method: bpf}")), "delay has no BPF implementation",
     "net.delay"),
    ("fault-and-detect", method("- {type: action, name: x, provider: {type: tracehound, "
                                "fault: io.fill, detect: {}}}"), "exactly one of fault",
     "name: x"),
    ("fault-as-probe", method(fault("io.fill", "{path: /tmp, free_bytes: 0}",
                                    kind="probe")), "is an action, not a probe",
     "fault: io.fill"),
    ("fault-background", method(FILL.replace("name: fill", "name: fill\n  background: true")),
     "cannot run in the background", "fault: io.fill"),
    ("duplicate-fault-names", method(FILL, FILL.replace("/tmp", "/var/tmp")),
     "need unique names", "/var/tmp"),
    ("detect-before-fault", method("- {type: probe, name: d, provider: {type: tracehound, "
                                   "detect: {}}}", FILL), "no fault action comes before",
     "name: d"),
    ("detect-unknown-fault", method(FILL, "- {type: probe, name: d, provider: {type: "
                                          "tracehound, detect: {fault: nope}}}"),
     "names no earlier fault action", "fault: nope"),
    ("detect-predicate", method(FILL, "- {type: probe, name: d, provider: {type: tracehound, "
                                      "detect: {predicate: 'bigger than 3'}}}"),
     "must be a comparison and a number", "bigger than 3"),
    ("detect-selector", method(FILL, "- {type: probe, name: d, provider: {type: tracehound, "
                                     "detect: {query: 'up{job=}'}}}"),
     "cannot read label matcher", "up{job=}"),
    ("detect-signal", method(FILL, "- {type: probe, name: d, provider: {type: tracehound, "
                                   "detect: {query: up, signal: median}}}"),
     "signal must be one of", "median"),
    ("detect-prometheus-no-url", method(FILL, "- {type: probe, name: d, provider: {type: "
                                              "tracehound, detect: {source: prometheus, "
                                              "query: up}}}"),
     "needs the server's url", "prometheus"),
    ("rollback-unknown", method(FILL, "- {type: action, name: r, provider: {type: "
                                      "tracehound, rollback: fil}}"),
     "did you mean 'fill'", "rollback: fil"),
    ("ref-unknown", method(FILL, "- {ref: nothing-by-that-name}"), "names no activity",
     "nothing-by-that-name"),
    ("config-unknown-ref", VALID.replace('path: "${dir}"', 'path: "${nope}"'),
     "names no configuration entry", "${nope}"),
    ("config-env-no-key", VALID.replace("  dir: /tmp", "  dir: {type: env}"),
     "needs the variable name in 'key'", "dir: {type: env}"),
    ("config-env-unset", VALID.replace("  dir: /tmp", "  dir: {type: env, key: "
                                                     "TRACEHOUND_TEST_SURELY_UNSET}"),
     "is not set and there is no default", "TRACEHOUND_TEST_SURELY_UNSET"),
    ("fault-in-rollbacks", VALID.replace('    name: say-done\n    provider: {type: process, '
                                         'path: "true"}\n',
                                         "    name: say-done\n    provider: {type: tracehound,"
                                         " fault: io.fill, arguments: {path: /tmp, "
                                         "free_bytes: 0}}\n"),
     "faults are applied in the method only", "{type: tracehound, fault: io.fill"),
]


def test_at_least_fifty_different_refusals(tmp_path, capsys, monkeypatch):
    """The cases are told apart by the validator itself: fifty of them or
    more, each refused, with fifty different messages or more (a catch-all
    refusal would give one)."""
    monkeypatch.delenv("TRACEHOUND_TEST_SURELY_UNSET", raising=False)
    assert len({c[0] for c in CASES}) == len(CASES)
    refusals = set()
    for name, text, _, _ in CASES:
        path = tmp_path / (name + (".json" if name.startswith("json") else ".yaml"))
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        assert cli.main(["chaos", "validate", str(path)]) == 2, name
        refusals.add(capsys.readouterr().err.replace(str(path), "FILE"))
    assert len(refusals) >= 50, refusals


def test_the_base_is_valid(tmp_path, capsys):
    path = tmp_path / "ok.yaml"
    path.write_text(VALID)
    assert cli.main(["chaos", "validate", str(path)]) == 0
    assert "valid experiment 'valid base'" in capsys.readouterr().out


@pytest.mark.parametrize("name,text,fragment,line", CASES, ids=[c[0] for c in CASES])
def test_malformed_experiment_is_refused(name, text, fragment, line, tmp_path, capsys,
                                         no_faults_touched, monkeypatch):
    monkeypatch.delenv("TRACEHOUND_TEST_SURELY_UNSET", raising=False)
    path = tmp_path / ("case.json" if name.startswith("json") else "case.yaml")
    if name == "non-utf8":
        path.write_bytes(text)
    else:
        path.write_text(text)
    assert cli.main(["chaos", "validate", str(path)]) == 2
    errors = capsys.readouterr().err
    assert fragment in errors, errors
    if line is not None:
        number = next(i for i, row in enumerate(text.splitlines(), 1) if line in row)
        assert f"{path}:{number}:" in errors, errors
    journal, report = tmp_path / "journal", tmp_path / "report"
    before = sorted(os.listdir(tmp_path))
    code = cli.main(["chaos", "run", str(path), "--yes", "--journal", str(journal),
                     "--report", str(report)])
    assert code == 2
    assert "nothing was run" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == before       # no journal, no report
    assert no_faults_touched == []


def test_non_utf8_bytes_are_refused(tmp_path, capsys):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"title: \xff\xfe\n")
    assert cli.main(["chaos", "validate", str(path)]) == 2
    assert "not UTF-8" in capsys.readouterr().err


def test_every_problem_is_reported_not_just_the_first(tmp_path, capsys):
    text = method(fault("io.throttle", "{device: 7}"), "- {type: probe, name: d, provider: "
                  "{type: tracehound, detect: {predicate: big}}}")
    path = tmp_path / "many.yaml"
    path.write_text(text.replace("title: valid base\n", ""))
    assert cli.main(["chaos", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    for fragment in ("'title' is missing", "exactly one target: cgroup or job_id", "device: must be a "
                     "string", "give at least one limit", "must be a comparison",
                     "5 problem(s)"):
        assert fragment in err, err


def test_problems_name_the_field_path(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(method(fault("net.loss", "{interface: x, netns: n, percent: 0}")))
    cli.main(["chaos", "validate", str(path)])
    assert "method[0].provider.arguments.percent: must be at least 0.01" in \
        capsys.readouterr().err


def test_json_experiments_validate_with_lines(tmp_path, capsys):
    import yaml
    data = yaml.safe_load(VALID)
    data["method"][0]["provider"]["arguments"]["free_bytes"] = "lots"
    path = tmp_path / "e.json"
    path.write_text(json.dumps(data, indent=2))
    assert cli.main(["chaos", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "free_bytes: must be an integer" in err
    assert f"{path}:" in err and "method[0]" in err
