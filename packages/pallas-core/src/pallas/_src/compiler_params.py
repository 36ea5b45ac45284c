"""The base of every backend's ``CompilerParams``; the subclass names its backend."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class CompilerParams:
    """Backend options for ``pallas_call``. Passing an instance selects its backend.

    Subclasses set ``BACKEND`` to the backend name they belong to (e.g. ``"triton"``).
    """

    BACKEND: ClassVar[str | None] = None


def _frozen(v):
    if isinstance(v, dict):
        return FrozenParams(v)
    if isinstance(v, list | tuple):
        return tuple(_frozen(x) for x in v)
    return v


class FrozenParams(Mapping):
    """The dict form of ``compiler_params``, ``{backend name: {option: value}}``, made
    hashable (a primitive parameter must be). The backend chosen at lowering reads its
    own entry (see ``pallas.plugins.resolve_compiler_params``)."""

    def __init__(self, d: Mapping):
        self._items = tuple((k, _frozen(v)) for k, v in d.items())
        self._dict = dict(self._items)

    def __getitem__(self, k):
        return self._dict[k]

    def __iter__(self):
        return iter(self._dict)

    def __len__(self) -> int:
        return len(self._dict)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self) == dict(other)

    def __repr__(self) -> str:
        return f"{dict(self)!r}"

    def thaw(self) -> dict:
        """A plain dict (nested entries too), as the user wrote it."""
        return {k: v.thaw() if isinstance(v, FrozenParams) else v for k, v in self.items()}
