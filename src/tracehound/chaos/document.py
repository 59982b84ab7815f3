"""Loading an experiment file without trusting it.

YAML is composed into nodes (never constructed by PyYAML's own constructor,
which expands aliases without bound) and converted here with limits on size,
depth and alias expansion. Every value's line number is kept by its path
("method[2].provider.fault"), so validation can point at the line.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import yaml

from . import trust

MAX_FILE_BYTES = 1 << 20          # an experiment is a few KiB; 1 MiB is generous
MAX_NODES = 100_000               # values after alias expansion (YAML bombs)
MAX_DEPTH = 64                    # nesting, recursive aliases included


class DocumentError(Exception):
    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.message = message
        self.line = line


@dataclass
class Document:
    path: str
    data: object
    lines: dict[str, int] = field(default_factory=dict)
    stat: os.stat_result | None = None     # of the file it was read from

    def line(self, path: str) -> int | None:
        """Line of the value at path, or of its nearest parent that has one."""
        while path:
            if path in self.lines:
                return self.lines[path]
            cut = max(path.rfind("."), path.rfind("["))
            if cut <= 0:
                break
            path = path[:cut]
        return self.lines.get(path)


def child_path(parent: str, key) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else str(key)


def load(path: str) -> Document:
    """The experiment at path: a regular file (not a symbolic link, FIFO or
    device: see trust.py), read up to MAX_FILE_BYTES. The file's stat is kept
    for the checks a root run makes on who could have written it."""
    try:
        fd, st = trust.open_regular(path)
    except trust.UntrustedFile as exc:
        raise DocumentError(str(exc)) from None
    except OSError as exc:
        raise DocumentError(f"cannot read {path}: {exc.strerror}") from None
    try:
        if st.st_size > MAX_FILE_BYTES:
            raise DocumentError(f"file is {st.st_size} bytes; experiments are limited to "
                                f"{MAX_FILE_BYTES} bytes")
        raw = trust.read_bounded(fd, MAX_FILE_BYTES)
    except OSError as exc:
        raise DocumentError(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_FILE_BYTES:
        raise DocumentError(f"file is larger than {MAX_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"not UTF-8 text (byte {exc.start})") from None
    doc = loads(text, path)
    doc.stat = st
    return doc


def loads(text: str, path: str = "<string>") -> Document:
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise DocumentError(f"document is larger than {MAX_FILE_BYTES} bytes")
    if not text.strip():
        raise DocumentError("the file is empty")
    if path.endswith(".json") or text.lstrip().startswith("{"):
        return _load_json(text, path)
    return _load_yaml(text, path)


def _load_json(text: str, path: str) -> Document:
    def no_duplicates(pairs):
        seen = {}
        for k, v in pairs:
            if k in seen:
                raise DocumentError(f"duplicate key '{k}'")
            seen[k] = v
        return seen

    try:
        data = json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as exc:
        raise DocumentError(f"invalid JSON: {exc.msg} (column {exc.colno})", exc.lineno) from None
    except RecursionError:
        raise DocumentError(f"nesting deeper than {MAX_DEPTH} levels") from None
    _check_json_shape(data, 0, [0])
    # JSON is (nearly always) YAML too: compose it only for line numbers.
    lines: dict[str, int] = {}
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None:
            _Converter(lines).convert(node, "", 0)
    except (yaml.YAMLError, DocumentError, RecursionError):
        lines = {}
    return Document(path, data, lines)


def _check_json_shape(value, depth: int, count: list[int]) -> None:
    count[0] += 1
    if count[0] > MAX_NODES:
        raise DocumentError(f"more than {MAX_NODES} values")
    if depth > MAX_DEPTH:
        raise DocumentError(f"nesting deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        for v in value.values():
            _check_json_shape(v, depth + 1, count)
    elif isinstance(value, list):
        for v in value:
            _check_json_shape(v, depth + 1, count)


def _load_yaml(text: str, path: str) -> Document:
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise DocumentError(f"invalid YAML: {exc.problem or exc.context}", line) from None
    except yaml.YAMLError as exc:
        raise DocumentError(f"invalid YAML: {exc}") from None
    except RecursionError:
        raise DocumentError(f"nesting deeper than {MAX_DEPTH} levels") from None
    nodes = [n for n in nodes if n is not None]
    if not nodes:
        raise DocumentError("the file holds no document")
    if len(nodes) > 1:
        raise DocumentError("the file holds several YAML documents; an experiment is one",
                            nodes[1].start_mark.line + 1)
    lines: dict[str, int] = {}
    data = _Converter(lines).convert(nodes[0], "", 0)
    return Document(path, data, lines)


_PLAIN = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


class _Converter:
    """YAML nodes -> plain Python, counting every value an alias expands to."""

    def __init__(self, lines: dict[str, int]):
        self.lines = lines
        self.count = 0
        self.scalars = yaml.SafeLoader("")

    def convert(self, node, path: str, depth: int):
        self.count += 1
        if self.count > MAX_NODES:
            raise DocumentError(f"more than {MAX_NODES} values after alias expansion "
                                "(a YAML bomb?)", node.start_mark.line + 1)
        if depth > MAX_DEPTH:
            raise DocumentError(f"nesting deeper than {MAX_DEPTH} levels (a recursive "
                                "alias?)", node.start_mark.line + 1)
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and node.tag not in _PLAIN:
            raise DocumentError(f"tag {node.tag} is not supported in experiments",
                                node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(item, child_path(path, i), depth + 1)
                    for i, item in enumerate(node.value)]
        try:
            value = self.scalars.construct_object(node)
        except yaml.YAMLError as exc:
            raise DocumentError(f"cannot read value: {getattr(exc, 'problem', exc)}",
                                node.start_mark.line + 1) from None
        if value is not None and not isinstance(value, (str, int, float, bool)):
            # dates, binary: not JSON, so not journal-able; quote them instead
            raise DocumentError(f"{type(value).__name__} values are not supported; "
                                "quote the value to make it a string",
                                node.start_mark.line + 1)
        return value

    def _mapping(self, node, path: str, depth: int) -> dict:
        out: dict = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise DocumentError("merge keys (<<) are not supported in experiments",
                                    key_node.start_mark.line + 1)
            if not isinstance(key_node, yaml.ScalarNode):
                raise DocumentError("mapping keys must be plain strings",
                                    key_node.start_mark.line + 1)
            key = self.convert(key_node, child_path(path, "<key>"), depth + 1)
            if not isinstance(key, str):
                raise DocumentError(f"mapping key {key!r} must be a string",
                                    key_node.start_mark.line + 1)
            if key in out:
                raise DocumentError(f"duplicate key '{key}'", key_node.start_mark.line + 1)
            # a field's line is its key's: "method:" rather than its first item
            self.lines.setdefault(child_path(path, key), key_node.start_mark.line + 1)
            out[key] = self.convert(value_node, child_path(path, key), depth + 1)
        return out
