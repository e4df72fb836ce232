"""Frozen, slotted, keyword-only value objects without importing ``dataclasses``.

Why not ``dataclasses``: on the machines corral targets, ``import dataclasses``
pulls in ``inspect``, ``re``, ``enum`` and friends and costs 10-15 ms, more than
the whole budget of the ``corral run`` hot path (see docs/design.md, "Start-up
budget"). :class:`Record` gives the same contract for the subset we use:

* fields come from the class annotations, in order; a class attribute is the
  field's default (defaults must be immutable: tuples, frozensets, records);
* ``__init__`` is keyword-only and rejects unknown or missing fields;
* instances are immutable (``__setattr__`` raises), hashable when their fields
  are, and compare equal field by field when they have the same type;
* :meth:`Record.replace` returns a copy with some fields changed.

Type checkers see it as a frozen, keyword-only dataclass through
``dataclass_transform`` (PEP 681).

Example::

    class Limits(Record):
        memory: int | None = None
        pids: int | None = None

    lim = Limits(memory=1 << 30)
    lim.replace(pids=64)  # Limits(memory=1073741824, pids=64)
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: ``import typing`` costs ~10 ms here
if TYPE_CHECKING:
    from typing import Any, ClassVar, Self, dataclass_transform
else:

    def dataclass_transform(**_kwargs: object) -> object:
        return lambda cls: cls


__all__ = ["FrozenInstanceError", "Record"]

_MISSING: Any = object()


class FrozenInstanceError(AttributeError):
    """Raised when code tries to change a field of a :class:`Record`."""


class _RecordMeta(type):
    """Turns annotations into ``__slots__`` and records the field defaults."""

    def __new__(
        mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any
    ) -> _RecordMeta:
        annotations: dict[str, str] = namespace.get("__annotations__", {})
        own_fields = [
            field
            for field, annotation in annotations.items()
            if not str(annotation).startswith(("ClassVar", "typing.ClassVar"))
        ]
        defaults: dict[str, Any] = {}
        inherited: tuple[str, ...] = ()
        for base in bases:
            inherited += getattr(base, "_fields", ())
            defaults.update(getattr(base, "_defaults", {}))
        for field in own_fields:
            if field in namespace:
                defaults[field] = namespace.pop(field)
        namespace["__slots__"] = tuple(own_fields)
        namespace["_fields"] = inherited + tuple(f for f in own_fields if f not in inherited)
        namespace["_defaults"] = defaults
        return super().__new__(mcls, name, bases, namespace, **kwargs)


@dataclass_transform(frozen_default=True, kw_only_default=True)
class Record(metaclass=_RecordMeta):
    """Base class of corral's immutable value objects (see module docstring)."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    _defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, **values: Any) -> None:
        cls = type(self)
        setter = object.__setattr__
        for field in cls._fields:
            value = values.pop(field, _MISSING)
            if value is _MISSING:
                value = cls._defaults.get(field, _MISSING)
                if value is _MISSING:
                    raise TypeError(f"{cls.__name__}() missing required field {field!r}")
            setter(self, field, value)
        if values:
            unknown = ", ".join(sorted(values))
            raise TypeError(f"{cls.__name__}() got unknown field(s): {unknown}")

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r} of a frozen record")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r} of a frozen record")

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, field) for field in self._fields)

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True  # immutable: the same record is equal to itself (the common case)
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._values()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{field}={getattr(self, field)!r}" for field in self._fields)
        return f"{type(self).__name__}({inner})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), dict(zip(self._fields, self._values(), strict=True))))

    def replace(self, **changes: Any) -> Self:
        """Return a copy of this record with *changes* applied."""
        values = dict(zip(self._fields, self._values(), strict=True))
        unknown = set(changes) - set(values)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field(s): {', '.join(sorted(unknown))}")
        values.update(changes)
        return type(self)(**values)

    def fields(self) -> dict[str, Any]:
        """Return the fields as a new ``{name: value}`` dict (shallow)."""
        return dict(zip(self._fields, self._values(), strict=True))


def _rebuild(cls: type[Record], values: dict[str, Any]) -> Record:
    return cls(**values)
