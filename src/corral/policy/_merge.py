"""Layering: merge validated layers in order, keeping the source of every value.

Rules (later layers win):

* scalars: the later value replaces the earlier one;
* lists: entries accumulate across layers without duplicates; ``"!x"`` (a
  ``REMOVE`` operation) removes an earlier ``x``. A credential with the name of
  an earlier one replaces it in place; ``"!NAME"`` removes credentials by name
  and ``"!GLOB"`` rules by their ``match``;
* maps: names accumulate; a later value for a name replaces it; ``null``
  removes it.

Every scalar, list entry and map entry remembers the label of the layer that
set it (``"defaults"``, ``"project /p/.corral/settings.json"``,
``"profile:ci"`` ...), for ``corral policy --explain``.

**Untrusted layers** (a project file the user has not trusted with ``corral
trust``) may only tighten the policy. Each change is judged by its key's
tighten direction (:mod:`corral.policy._keys`) against the value in force;
loosening changes are dropped, with one warning per key and layer. A change
that changes nothing is never a loosening.
"""

from __future__ import annotations

from . import _keys as k
from ._model import isolation_rank
from ._validate import ADD, Rule

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["MergeState", "untrusted_warning"]

_MISSING: Any = object()


def untrusted_warning(key: str, path: str) -> str:
    """The warning for a loosening *key* ignored from the untrusted file *path*."""
    return (
        f"ignoring {key} from untrusted {path} (it would loosen the policy); "
        "run 'corral trust' to accept it"
    )


def _identity(row: k.Key, item: Any) -> Any:
    """What a ``"!x"`` removal and de-duplication compare an entry by."""
    if row.kind == k.CREDENTIALS:
        return item.name
    return item


def _removes(row: k.Key, entry: Any, target: Any) -> bool:
    if row.kind == k.RULES:
        return bool(entry.match == target)
    return bool(_identity(row, entry) == target)


class MergeState:
    """The merged settings so far, with provenance.

    Attributes:
        values: key path → value (scalars as is, lists as lists, maps as dicts).
        sources: key path → label of the last layer that changed the key.
        entry_sources: for list keys, the label of each entry; for map keys,
            name → label.
        warnings: messages for the user, in order.
    """

    __slots__ = ("entry_sources", "sources", "table", "values", "warnings")

    def __init__(
        self, table: k.KeyTable, defaults: dict[str, Any], label: str = "defaults"
    ) -> None:
        self.table = table
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.entry_sources: dict[str, Any] = {}
        self.warnings: list[str] = []
        for row in table.rows:
            value = defaults.get(row.path)
            if row.merge == k.CONCAT:
                value = list(value or ())
                self.entry_sources[row.path] = [label] * len(value)
            elif row.merge == k.PER_KEY:
                value = dict(value or {})
                self.entry_sources[row.path] = dict.fromkeys(value, label)
            self.values[row.path] = value
            self.sources[row.path] = label

    def apply(self, layer: dict[str, Any], label: str, *, untrusted: str | None = None) -> None:
        """Merge the validated *layer* under *label*.

        Args:
            layer: flat values from :func:`~corral.policy._validate.validate_layer`.
            label: the provenance label of the layer.
            untrusted: the file path when the layer is an untrusted project
                file (then only tightening changes apply); ``None`` otherwise.
        """
        for row in self.table.rows:
            new = layer.get(row.path, _MISSING)
            if new is _MISSING:
                continue
            if row.merge == k.CONCAT:
                ignored = self._concat(row, new, label, untrusted)
            elif row.merge == k.PER_KEY:
                ignored = self._per_key(row, new, label, untrusted)
            else:
                ignored = self._replace(row, new, label, untrusted)
            if ignored:
                assert untrusted is not None
                self.warnings.append(untrusted_warning(row.path, untrusted))

    # ------------------------------------------------------------ scalars
    def _replace(self, row: k.Key, new: Any, label: str, untrusted: str | None) -> bool:
        current = self.values[row.path]
        if untrusted is not None and new != current and not self._tightens(row, current, new):
            return True
        self.values[row.path] = new
        self.sources[row.path] = label
        return False

    def _tightens(self, row: k.Key, current: Any, new: Any) -> bool:
        """Whether replacing *current* with *new* (they differ) tightens the policy."""
        direction = row.tighten
        if direction == k.TRUE_TIGHTENS:
            return new is True
        if direction == k.FALSE_TIGHTENS:
            if isinstance(new, tuple):  # network.allowUnixSockets: a list of socket paths
                return current is True or (isinstance(current, tuple) and set(new) <= set(current))
            return new is False
        if direction == k.BACKEND:
            return self._backend_rank(new) >= max(
                isolation_rank(self.values["isolation"]), self._backend_rank(current)
            )
        if direction in (k.HIGHER, k.LOWER):
            if row.choices:
                order = row.choices.index(new) - row.choices.index(current)
            elif new is None or current is None:
                order = 1 if new is None else -1  # null means no limit: the highest value
            else:
                order = 1 if new > current else -1
            return order > 0 if direction == k.HIGHER else order < 0
        assert direction == k.LOOSENS, direction
        return False

    def _backend_rank(self, backend: str) -> int:
        """The isolation rank *backend* guarantees; ``auto`` guarantees the minimum."""
        level = k.BACKEND_ISOLATION[backend] or self.values["isolation"]
        return isolation_rank(level)

    # ------------------------------------------------------------ lists
    def _concat(
        self, row: k.Key, ops: list[tuple[str, Any]], label: str, untrusted: str | None
    ) -> bool:
        entries: list[Any] = self.values[row.path]
        sources: list[str] = self.entry_sources[row.path]
        ignored = changed = False
        for op, item in ops:
            if op == ADD:
                allowed = untrusted is None or row.tighten == k.ADDITIONS
                ident = _identity(row, item)
                index = next((i for i, e in enumerate(entries) if _identity(row, e) == ident), -1)
                if index >= 0 and entries[index] == item:
                    continue  # already there: de-duplicated
                if not allowed:
                    ignored = True
                elif index >= 0:  # a credential of the same name: replace it in place
                    entries[index] = item
                    sources[index] = label
                    changed = True
                else:
                    entries.append(item)
                    sources.append(label)
                    changed = True
                continue
            hits = [i for i, e in enumerate(entries) if _removes(row, e, item)]
            if not hits:
                if untrusted is None:
                    shown = item if isinstance(item, str) else repr(item)
                    self.warnings.append(
                        f'{label}: {row.path}: "!{shown}" removes nothing '
                        "(no earlier entry matches)"
                    )
            elif untrusted is not None and row.tighten != k.REMOVALS:
                ignored = True
            else:
                for i in reversed(hits):
                    del entries[i]
                    del sources[i]
                changed = True
        if changed:
            self.sources[row.path] = label
        return ignored

    # ------------------------------------------------------------ maps
    def _per_key(self, row: k.Key, new: dict[str, Any], label: str, untrusted: str | None) -> bool:
        entries: dict[str, Any] = self.values[row.path]
        sources: dict[str, str] = self.entry_sources[row.path]
        ignored = changed = False
        for name, value in new.items():
            current = entries.get(name, _MISSING)
            if (value is None and current is _MISSING) or value == current:
                continue
            if untrusted is not None:  # every map key loosens (see _keys._check_row)
                ignored = True
                continue
            if value is None:
                del entries[name]
                del sources[name]
            else:
                entries[name] = value
                sources[name] = label
            changed = True
        if changed:
            self.sources[row.path] = label
        return ignored

    def add_entry(self, path: str, item: Any, label: str) -> None:
        """Append *item* to the list key *path* unless it is there (for corral's own rows)."""
        entries: list[Any] = self.values[path]
        if item not in entries:
            entries.append(item)
            self.entry_sources[path].append(label)

    # ------------------------------------------------------------ output
    def provenance(self) -> dict[str, str]:
        """Flatten the sources: ``key``, ``key[i]`` (list entries), ``key.name`` (map entries)."""
        out: dict[str, str] = {}
        for row in self.table.rows:
            out[row.path] = self.sources[row.path]
            entry_sources = self.entry_sources.get(row.path)
            if isinstance(entry_sources, list):
                for index, source in enumerate(entry_sources):
                    out[f"{row.path}[{index}]"] = source
            elif isinstance(entry_sources, dict):
                for name, source in entry_sources.items():
                    out[f"{row.path}.{name}"] = source
        return out

    def rules(self) -> list[Rule]:
        """The merged ``rules`` entries, in order."""
        return list(self.values.get("rules") or ())
