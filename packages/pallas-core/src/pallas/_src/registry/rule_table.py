"""Rule tables: one mechanism for interpreter and lowering rules, keyed by primitive.

Every table (the core interpreter's, each backend's lowering) is a :class:`RuleTable`
with one rule signature. A primitive gets at most one *base* rule, registered next to
the primitive's definition; another package changes that rule only through an explicit
:meth:`RuleTable.override`, applied in a fixed order (``order``, then owner name), so the
result never depends on which plugin was imported or discovered first. A table also
records the primitives its backend does *not* support and why, so coverage can be tested
and errors can say what to do instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

Rule = Callable[..., Any]
#: An override: given the rule it replaces (``None`` if there is none), returns the new
#: rule (same signature).
Override = Callable[[Rule | None], Rule]


class RuleConflictError(ValueError):
    """Two packages registered a base rule for the same primitive in one table."""


RuleConflictError.__module__ = "pallas.plugins"


@dataclasses.dataclass(frozen=True)
class _Base:
    rule: Rule
    owner: str


@dataclasses.dataclass(frozen=True)
class _Override:
    order: int
    owner: str
    wrap: Override


def _owner_of(fn: Any) -> str:
    return (getattr(fn, "__module__", None) or "?").split(".")[0]


class RuleTable(Mapping):
    """Rules of one kind (``name``), keyed by primitive object.

    Read it as a mapping ``{primitive: rule}`` (the rule with its overrides applied).
    Register with :meth:`register` (a decorator), change another package's rule with
    :meth:`override`, declare gaps with :meth:`unsupported`. A table with a ``parent``
    (a backend building on another's lowering, e.g. SparseCore on pallas-tpu) answers
    from its own rules first, then from the parent's.
    """

    def __init__(self, name: str, signature: str, *, parent: RuleTable | None = None):
        self.name = name
        self.signature = signature  # documents the one rule signature of this table
        self.parent = parent
        self._base: dict[Any, _Base] = {}
        self._overrides: dict[Any, dict[str, _Override]] = {}
        self._unsupported: dict[Any, str] = {}
        self._composed: dict[Any, Rule] = {}

    # -- registering ----------------------------------------------------------------
    def register(self, *prims: Any, owner: str | None = None) -> Callable[[Rule], Rule]:
        """Decorator: ``rule`` is the base rule of each of ``prims``.

        ``owner`` (default: the top-level package defining ``rule``) names who provides
        it in errors. Registering again from the same owner replaces the rule; a
        different owner is a :class:`RuleConflictError` (use :meth:`override`).
        """
        if not prims:
            raise TypeError(f"{self.name}.register() needs at least one primitive")
        for p in prims:
            self._check_primitive(p)

        def register(rule: Rule) -> Rule:
            who = owner or _owner_of(rule)
            for p in prims:
                cur = self._base.get(p)
                if cur is not None and cur.owner != who and cur.rule is not rule:
                    raise RuleConflictError(
                        f"{self.name}: {who} registers a rule for the primitive "
                        f"{_name(p)!r}, which already has one from {cur.owner}; change "
                        f"another package's rule with {self.name}.override(...)")
                self._base[p] = _Base(rule, cur.owner if cur and cur.rule is rule else who)
                self._unsupported.pop(p, None)
                self._composed.pop(p, None)
            return rule

        return register

    def override(self, prim: Any, *, owner: str, order: int = 0
                 ) -> Callable[[Override], Override]:
        """Decorator: ``wrap(rule) -> rule`` replaces ``prim``'s rule, e.g. to handle a
        case the base rule does not and defer to it otherwise.

        Overrides apply in increasing ``order``, then by ``owner``, whatever the import
        order; one owner has at most one override per primitive (registering again
        replaces it).
        """
        self._check_primitive(prim)

        def register(wrap: Override) -> Override:
            self._overrides.setdefault(prim, {})[owner] = _Override(order, owner, wrap)
            self._composed.pop(prim, None)
            return wrap

        return register

    def discard_override(self, prim: Any, owner: str) -> None:
        """Removes ``owner``'s override of ``prim`` (if any)."""
        if self._overrides.get(prim, {}).pop(owner, None) is not None:
            self._composed.pop(prim, None)

    @contextlib.contextmanager
    def overridden(self, prim: Any, wrap: Override, *, owner: str = "test",
                   order: int = 1 << 30) -> Iterator[None]:
        """Within the ``with`` block, ``wrap`` overrides ``prim``'s rule (last of all,
        by default): for tests that plant a fault in one rule."""
        self.override(prim, owner=owner, order=order)(wrap)
        try:
            yield
        finally:
            self.discard_override(prim, owner)

    def unsupported(self, *prims: Any, reason: str) -> None:
        """Declares that this table has no rule for ``prims``; ``reason`` says why or what
        to do instead (it is quoted in the "cannot lower" error)."""
        for p in prims:
            self._check_primitive(p)
            if p in self._base:
                raise RuleConflictError(
                    f"{self.name}: the primitive {_name(p)!r} has a rule from "
                    f"{self._base[p].owner}; it cannot also be declared unsupported")
            self._unsupported[p] = reason

    # -- reading --------------------------------------------------------------------
    def get(self, prim: Any, default: Any = None) -> Rule | None:
        """The rule for ``prim`` with every override applied, or ``default``."""
        rule = self._composed.get(prim)
        if rule is not None:
            return rule
        base = self._base.get(prim)
        overrides = self._overrides.get(prim)
        if base is None and not overrides:
            if self.parent is not None and prim not in self._unsupported:
                return self.parent.get(prim, default)
            return default
        rule = base.rule if base is not None else None
        for o in sorted((overrides or {}).values(), key=lambda o: (o.order, o.owner)):
            rule = o.wrap(rule)
        self._composed[prim] = rule
        return rule

    def __getitem__(self, prim: Any) -> Rule:
        rule = self.get(prim)
        if rule is None:
            raise KeyError(prim)
        return rule

    def __iter__(self) -> Iterator[Any]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def __contains__(self, prim: object) -> bool:
        return self.get(prim) is not None

    def _keys(self) -> dict:
        keys = dict.fromkeys([*self._base, *self._overrides])
        if self.parent is not None:
            keys.update((p, None) for p in self.parent if p not in self._unsupported)
        return keys

    def require(self, prim: Any, missing: Callable[[str | None], BaseException]) -> Rule:
        """The rule for ``prim``; without one, raises ``missing(reason)`` (``reason``: why
        it has none, when that was declared with :meth:`unsupported`, else None), the
        walker's own "cannot lower" error."""
        rule = self.get(prim)
        if rule is None:
            raise missing(self.unsupported_reason(prim))
        return rule

    def unsupported_reason(self, prim: Any) -> str | None:
        """Why ``prim`` has no rule, when that was declared (here or in the parent)."""
        reason = self._unsupported.get(prim)
        if reason is None and self.parent is not None and prim not in self:
            return self.parent.unsupported_reason(prim)
        return reason

    def owners(self, prim: Any) -> list[str]:
        """Who provides ``prim``'s rule: the base rule's owner, then each override's."""
        base = self._base.get(prim)
        if base is None and prim not in self._overrides and self.parent is not None:
            return self.parent.owners(prim)
        out = [base.owner] if base else []
        out += [o.owner for o in sorted(self._overrides.get(prim, {}).values(),
                                        key=lambda o: (o.order, o.owner))]
        return out

    def missing(self, prims: Iterable[Any]) -> list[Any]:
        """The ``prims`` with neither a rule nor a declared reason (for coverage tests)."""
        return [p for p in prims if p not in self and self.unsupported_reason(p) is None]

    def __repr__(self) -> str:
        parent = f", parent {self.parent.name!r}" if self.parent is not None else ""
        return (f"RuleTable({self.name!r}: {len(self)} rules, "
                f"{len(self._unsupported)} unsupported{parent})")

    def _check_primitive(self, p: Any) -> None:
        if isinstance(p, str) or not hasattr(p, "bind"):
            raise TypeError(
                f"{self.name}: rules are keyed by primitive objects (e.g. lax.add_p), "
                f"not {p!r}")


def _name(p: Any) -> str:
    return getattr(p, "name", str(p))
