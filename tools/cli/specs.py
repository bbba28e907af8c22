"""Journal spec files: a YAML tree with directory-style inheritance (gazctl's format).

    name: clicks/                   # a directory: its name ends in '/'
    replication: 1
    labels: {topic: clicks}
    fragment:
      length: 64MiB
      compression_codec: zstd
      stores: [file:///var/lib/quire/fragments/]
      refresh_interval: 30s         # durations: seconds, or 250ms / 10m / 1h30m
      flush_interval: 10m
    children:
      - name: clicks/part-000       # a journal: inherits every field set above it
      - name: clicks/part-001
        revision: 12                # optional: apply only if still at this mod revision
      - name: clicks/old-part
        delete: true                # remove it (delete on a directory removes its children)

A field set on a child replaces the parent's (for `labels` and `fragment`, key by key).
`revision` belongs to journals only: absent or -1 = no check, 0 = must not exist yet.
A file may hold one tree or a list of trees (or several YAML documents).

`render()` is the inverse used by `journals list -o yaml`: journals are grouped under
their directory with the fields they share hoisted into it, and each carries its
revision, so the output can be edited and applied back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import msgspec
import yaml

from protocol import ApplyChange, JournalSpec, LabelSet, ListEntry, parse_duration
from protocol.errors import ValidationError

_DURATIONS = ("refresh_interval", "retention", "flush_interval")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KB|KiB|MB|MiB|GB|GiB|TB|TiB)?", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "kib": 1 << 10, "mb": 10**6, "mib": 1 << 20, "gb": 10**9,
          "gib": 1 << 30, "tb": 10**12, "tib": 1 << 40}
_NODE_KEYS = {"name", "children", "revision", "delete"}


def parse_size(value: Any, path: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = _SIZE.fullmatch(str(value).strip())
    if not m:
        raise ValidationError(path, f"{value!r} is not a size (e.g. 1048576, 64MiB, 1GB)")
    return int(float(m[1]) * _UNITS[(m[2] or "b").lower()])


def _labels_to_mapping(labels: Any, path: str) -> dict[str, list[str]]:
    """Labels as {name: [values]} from a mapping or gazctl's [{name, value}] list."""
    out: dict[str, list[str]] = {}
    if labels is None:
        return out
    if isinstance(labels, dict) and "labels" in labels and isinstance(labels["labels"], list):
        labels = labels["labels"]  # msgspec's own LabelSet shape
    if isinstance(labels, dict):
        for name, value in labels.items():
            values = value if isinstance(value, list) else [value]
            out[str(name)] = ["" if v is None else str(v) for v in values]
    elif isinstance(labels, list):
        for i, item in enumerate(labels):
            if not isinstance(item, dict) or "name" not in item:
                raise ValidationError(f"{path}[{i}]", "expected {name: ..., value: ...}")
            out.setdefault(str(item["name"]), []).append(str(item.get("value", "") or ""))
    else:
        raise ValidationError(path, "expected a mapping of name: value")
    return out


def _merge(parent: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    merged = dict(parent)
    for key, value in child.items():
        if key in ("labels", "fragment") and isinstance(value, dict) and key in merged:
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def _fields(node: dict[str, Any], path: str) -> dict[str, Any]:
    fields = {k: v for k, v in node.items() if k not in _NODE_KEYS and v is not None}
    if "labels" in fields:
        fields["labels"] = _labels_to_mapping(fields["labels"], f"{path}.labels")
    if "fragment" in fields and not isinstance(fields["fragment"], dict):
        raise ValidationError(f"{path}.fragment", "expected a mapping")
    return fields


def _to_spec(name: str, fields: dict[str, Any], path: str) -> JournalSpec:
    data = dict(fields)
    data["name"] = name
    data["labels"] = LabelSet.of(data.get("labels", {}))
    fragment = dict(data.get("fragment") or {})
    for key in _DURATIONS:
        if key in fragment:
            fragment[key] = parse_duration(fragment[key], f"{path}.fragment.{key}")
    if "length" in fragment:
        fragment["length"] = parse_size(fragment["length"], f"{path}.fragment.length")
    if "stores" in fragment and isinstance(fragment["stores"], str):
        fragment["stores"] = [fragment["stores"]]
    data["fragment"] = fragment
    if "max_append_rate" in data:
        data["max_append_rate"] = parse_size(data["max_append_rate"], f"{path}.max_append_rate")
    try:
        spec = msgspec.convert(data, JournalSpec, str_keys=True)
    except msgspec.ValidationError as exc:
        raise ValidationError(path, str(exc)) from None
    spec.validate()
    return spec


def parse(text: str, source: str = "specs") -> list[ApplyChange]:
    """ApplyChanges from a spec file (deletes carry revision -1 unless given)."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ValidationError(source, f"not valid YAML: {' '.join(str(exc).split())}") from None
    roots: list[Any] = []
    for doc in docs:
        roots.extend(doc if isinstance(doc, list) else [doc])
    changes: list[ApplyChange] = []
    seen: set[str] = set()

    def walk(node: Any, inherited: dict[str, Any], deleting: bool, path: str) -> None:
        if not isinstance(node, dict):
            raise ValidationError(path, "expected a mapping with at least a name")
        name = str(node.get("name") or "")
        fields = _merge(inherited, _fields(node, path))
        delete = deleting or bool(node.get("delete"))
        children = node.get("children") or []
        if not isinstance(children, list):
            raise ValidationError(f"{path}.children", "expected a list")
        if not name or name.endswith("/"):
            if "revision" in node:
                raise ValidationError(f"{path}.revision", "only journals carry a revision")
            for i, child in enumerate(children):
                child_name = str((child or {}).get("name") or "") if isinstance(child, dict) else ""
                if name and child_name and not child_name.startswith(name):
                    raise ValidationError(f"{path}.children[{i}].name",
                                          f"{child_name!r} is not under {name!r}")
                walk(child, fields, delete, f"{path}.children[{i}]")
            return
        if children:
            raise ValidationError(f"{path}.children", f"journal {name!r} cannot have children "
                                  "(directories end in '/')")
        if name in seen:
            raise ValidationError(path, f"journal {name!r} appears twice")
        seen.add(name)
        revision = node.get("revision", -1)
        if not isinstance(revision, int) or revision < -1:
            raise ValidationError(f"{path}.revision", f"{revision!r} is not -1, 0 or a revision")
        if delete:
            changes.append(ApplyChange(delete=name, expect_mod_revision=revision))
        else:
            changes.append(ApplyChange(upsert=_to_spec(name, fields, path),
                                       expect_mod_revision=revision))

    for i, root in enumerate(roots):
        walk(root, {}, False, f"{source}[{i}]" if len(roots) > 1 else source)
    return changes


# -- rendering ------------------------------------------------------------------------------

def spec_fields(spec: JournalSpec) -> dict[str, Any]:
    data = msgspec.to_builtins(spec)
    data.pop("name")
    labels = spec.labels.as_dict()
    data["labels"] = {k: (v[0] if len(v) == 1 else v) for k, v in labels.items()}
    return data


def _hoist(children: list[dict[str, Any]]) -> dict[str, Any]:
    """Fields every child shares, removed from the children."""
    if len(children) < 2:
        return {}
    shared: dict[str, Any] = {}
    first = children[0]
    for key, value in list(first.items()):
        if key in _NODE_KEYS:
            continue
        if key in ("labels", "fragment") and isinstance(value, dict):
            common = {k: v for k, v in value.items()
                      if all(k in c.get(key, {}) and c[key][k] == v for c in children[1:])}
            if common:
                shared[key] = common
                for c in children:
                    c[key] = {k: v for k, v in c[key].items() if k not in common}
                    if not c[key]:
                        del c[key]
        elif all(key in c and c[key] == value for c in children[1:]):
            shared[key] = value
            for c in children:
                del c[key]
    return shared


def render(entries: Iterable[ListEntry]) -> list[dict[str, Any]]:
    """A YAML-able tree of journals grouped by directory, round-tripping into parse()."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in sorted(entries, key=lambda e: e.spec.name):
        directory = entry.spec.name.rpartition("/")[0] + "/" if "/" in entry.spec.name else ""
        node = {"name": entry.spec.name, "revision": entry.mod_revision, **spec_fields(entry.spec)}
        groups.setdefault(directory, []).append(node)
    out: list[dict[str, Any]] = []
    for directory, children in groups.items():
        shared = _hoist(children)
        out.append({"name": directory, **shared, "children": children})
    return out
