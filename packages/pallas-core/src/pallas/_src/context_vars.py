"""Setting a ``contextvars.ContextVar`` for a ``with`` block: the trace-time settings of
pallas-core (the grid being traced, scalar prefetch, debug checks, ...) are such
variables, each with a context manager that sets it."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def set_for_block(var: contextvars.ContextVar, value: Any) -> Iterator[None]:
    """Sets ``var`` to ``value`` inside the ``with`` block, and back when it ends (also on
    an exception)."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)
