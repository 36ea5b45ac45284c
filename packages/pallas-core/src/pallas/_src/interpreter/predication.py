"""Predicated execution: running a branch on every device with its effects masked.

The interpreter simulates a remote DMA or remote signal with collectives over the mesh,
which every device must reach at the same program point. A ``cond`` whose predicate
differs between devices (``pl.when(axis_index == 0)`` around a remote copy) would
have some devices wait in a collective the others never enter. Such a ``cond`` is
instead run *predicated*: every device runs every branch in order, and each write a
branch makes to a :class:`~pallas.plugins.Cell` takes effect only where the branch is
the one taken (``active``). A remote delivery is the sender's effect, so the remote
rules write it :func:`unpredicated`, masked by the sender's own ``active`` instead.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import jax.numpy as jnp

_active: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "pallas_interpreter_active", default=None)


def active_or_true() -> Any:
    """Whether this device's writes take effect here: the current predicate (a traced
    bool scalar), ``True`` outside a predicated branch."""
    a = _active.get()
    return jnp.bool_(True) if a is None else a


@contextlib.contextmanager
def predicated(pred) -> Iterator[None]:
    """Writes inside take effect only where ``pred`` (and any enclosing predicate) holds."""
    outer = _active.get()
    pred = jnp.asarray(pred, jnp.bool_)
    token = _active.set(pred if outer is None else jnp.logical_and(outer, pred))
    try:
        yield
    finally:
        _active.reset(token)


@contextlib.contextmanager
def unpredicated() -> Iterator[None]:
    """Writes inside take effect whatever the branch (for a remote device's deliveries,
    which their rule masks with the sender's predicate itself)."""
    token = _active.set(None)
    try:
        yield
    finally:
        _active.reset(token)


def masked(new, old):
    """``new`` where the current predicate holds, else ``old`` (``new`` when unpredicated)."""
    a = _active.get()
    if a is None or old is None or new is None:
        return new
    return jnp.where(a, new, old)


class Written:
    """A class attribute (``Cell.value``, ``Cell.init``) whose assignment is a write of
    the kernel: kept in the slot ``_<name>``, masked inside a predicated branch."""

    def __set_name__(self, owner, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, obj, objtype=None):
        return self if obj is None else getattr(obj, self.slot)

    def __set__(self, obj, new) -> None:
        setattr(obj, self.slot, masked(new, getattr(obj, self.slot, None)))
