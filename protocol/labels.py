"""Labels, label sets and Kubernetes-style label selectors.

A `LabelSet` is a sorted list of (name, value) pairs; a name may repeat with different
values (a multi-valued label). Journal registers are also a LabelSet.

A `LabelSelector` has `include` and `exclude` sets. Per name: an include matches if the
set has the name with one of the listed values (an empty value means "any value"); an
exclude matches if the set has the name with one of the listed values. Text form:

    topic=clicks, region in (eu, us), !deprecated, tier!=cold, name:prefix=logs/

`name` and `prefix` are meta-labels filled in from the journal name when matching
(`prefix` holds every `/`-terminated prefix of the name; `name:prefix=x/` is sugar for
`prefix=x/`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import msgspec

from .errors import ValidationError
from .names import LABEL_NAME_MAX, LABEL_NAME_MIN, LABEL_VALUE_MAX, PATH_SYMBOLS, validate_token

META_NAME = "name"
META_PREFIX = "prefix"

CONTENT_TYPE = "content-type"
"""Well-known label: what a journal's bytes are (as Gazette's `content-type`)."""
RECOVERY_LOG = "application/x-quire-recoverylog"
"""`content-type` of a consumer shard's recovery log: pruned below its newest snapshot
(the guard offset) whatever its retention (workers/prune.py)."""


class Label(msgspec.Struct, frozen=True, order=True):
    name: str
    value: str = ""


def _validate_label(label: Label, path: str) -> None:
    validate_token(label.name, f"{path}.name", LABEL_NAME_MIN, LABEL_NAME_MAX)
    if label.value:
        validate_token(label.value, f"{path}.value", 0, LABEL_VALUE_MAX, PATH_SYMBOLS)


class LabelSet(msgspec.Struct, frozen=True):
    labels: tuple[Label, ...] = ()

    @classmethod
    def of(cls, pairs: Mapping[str, str | Iterable[str]] | Iterable[tuple[str, str]] = (),
           **kw: str) -> LabelSet:
        """Build a sorted, de-duplicated set from a mapping or pairs."""
        out: set[Label] = set()
        items = pairs.items() if isinstance(pairs, Mapping) else pairs
        for name, value in list(items) + list(kw.items()):
            if isinstance(value, str):
                out.add(Label(name, value))
            else:
                out.update(Label(name, v) for v in value)
        return cls(tuple(sorted(out)))

    def validate(self, path: str = "labels", *, reserved: bool = True) -> None:
        for i, label in enumerate(self.labels):
            _validate_label(label, f"{path}[{i}]")
            if reserved and label.name in (META_NAME, META_PREFIX):
                raise ValidationError(f"{path}[{i}].name", f"{label.name!r} is a reserved meta-label")
        for i in range(1, len(self.labels)):
            a, b = self.labels[i - 1], self.labels[i]
            if a >= b:
                raise ValidationError(f"{path}[{i}]", f"labels must be sorted and unique ({a} >= {b})")
            if a.name == b.name and (a.value == "") != (b.value == ""):
                raise ValidationError(f"{path}[{i}]", f"label {a.name!r} mixes empty and non-empty values")

    def values(self, name: str) -> list[str]:
        return [lb.value for lb in self.labels if lb.name == name]

    def value(self, name: str, default: str = "") -> str:
        vals = self.values(name)
        return vals[0] if vals else default

    def names(self) -> set[str]:
        return {lb.name for lb in self.labels}

    def as_dict(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for lb in self.labels:
            out.setdefault(lb.name, []).append(lb.value)
        return out

    def union(self, other: LabelSet) -> LabelSet:
        """Replace every name present in `other` with other's values (register union)."""
        names = other.names()
        kept = [lb for lb in self.labels if lb.name not in names]
        return LabelSet(tuple(sorted(set(kept) | set(other.labels))))

    def subtract(self, other: LabelSet) -> LabelSet:
        """Remove labels of `other`; an empty value in `other` removes every value of the name."""
        drop_names = {lb.name for lb in other.labels if lb.value == ""}
        drop = set(other.labels)
        return LabelSet(tuple(lb for lb in self.labels
                              if lb.name not in drop_names and lb not in drop))

    def with_meta(self, journal: str) -> LabelSet:
        """This set plus the `name` and `prefix` meta-labels of a journal name."""
        extra = [Label(META_NAME, journal)]
        parts = journal.split("/")
        for i in range(1, len(parts)):
            extra.append(Label(META_PREFIX, "/".join(parts[:i]) + "/"))
        return LabelSet(tuple(sorted(set(self.labels) | set(extra))))

    def __str__(self) -> str:
        return ", ".join(f"{lb.name}={lb.value}" if lb.value else lb.name for lb in self.labels)


class LabelSelector(msgspec.Struct, frozen=True):
    include: LabelSet = LabelSet()
    exclude: LabelSet = LabelSet()

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        return parse_selector(text)

    def validate(self, path: str = "selector") -> None:
        self.include.validate(f"{path}.include", reserved=False)
        self.exclude.validate(f"{path}.exclude", reserved=False)

    def matches(self, labels: LabelSet) -> bool:
        have = labels.as_dict()
        for name, wanted in self.include.as_dict().items():
            values = have.get(name)
            if values is None:
                return False
            if "" not in wanted and not (set(wanted) & set(values)):
                return False
        for name, unwanted in self.exclude.as_dict().items():
            values = have.get(name)
            if values is None:
                continue
            if "" in unwanted or set(unwanted) & set(values):
                return False
        return True

    def matches_journal(self, journal: str, labels: LabelSet) -> bool:
        return self.matches(labels.with_meta(journal))

    def __str__(self) -> str:
        parts: list[str] = []
        for sign, group in (("", self.include), ("!", self.exclude)):
            for name, values in group.as_dict().items():
                if values == [""]:
                    parts.append(f"{sign}{name}")
                elif len(values) == 1:
                    # `k==v` when v itself starts with '=': `k==x` would parse as k=x.
                    op = "!=" if sign else ("==" if values[0].startswith("=") else "=")
                    parts.append(f"{name}{op}{values[0]}")
                else:
                    parts.append(f"{name} {'notin' if sign else 'in'} ({', '.join(values)})")
        return ", ".join(parts)


_TERM = re.compile(
    r"""\s*(?:
        (?P<not>!)\s*(?P<absent>[^\s,=!()]+)                                  # !k
      | (?P<sname>[^\s,=!()]+)\s+(?P<op>in|notin)\s*\((?P<vals>[^()]*)\)      # k in (a, b)
      | (?P<cname>[^\s,=!()]+)\s*(?P<cmp>!=|==|=)\s*(?P<val>[^\s,()]*)        # k=v, k!=v
      | (?P<present>[^\s,=!()]+)                                             # k
    )\s*(?:,|$)""",
    re.VERBOSE,
)


def parse_selector(text: str) -> LabelSelector:
    """Parse `k=v, k!=v, k in (a,b), k notin (a,b), k, !k` (and `name:prefix=x/`)."""
    include: list[tuple[str, str]] = []
    exclude: list[tuple[str, str]] = []
    pos, text = 0, text.strip()
    while pos < len(text):
        m = _TERM.match(text, pos)
        if not m or m.end() == pos:
            raise ValidationError("selector", f"cannot parse {text[pos:]!r} in {text!r}")
        pos = m.end()
        if m["absent"]:
            exclude.append((m["absent"], ""))
        elif m["sname"]:
            values = [v.strip() for v in m["vals"].split(",") if v.strip()]
            if not values:
                raise ValidationError("selector", f"{m['sname']} {m['op']} () needs at least one value")
            (exclude if m["op"] == "notin" else include).extend((m["sname"], v) for v in values)
        elif m["cname"]:
            name, value = m["cname"], m["val"]
            if name == f"{META_NAME}:{META_PREFIX}":
                name = META_PREFIX
            if not value:
                raise ValidationError("selector", f"{name}{m['cmp']} needs a value")
            (exclude if m["cmp"] == "!=" else include).append((name, value))
        else:
            include.append((m["present"], ""))
    for name, value in include:
        if name == META_PREFIX and not value.endswith("/"):
            raise ValidationError("selector", f"prefix {value!r} must end in '/'")
    sel = LabelSelector(LabelSet.of(include), LabelSet.of(exclude))
    sel.validate()
    return sel
