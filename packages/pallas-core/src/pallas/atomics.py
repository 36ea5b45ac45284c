"""Atomic operations on refs for any backend (``from pallas import atomics``).

Beyond upstream, which has them only as ``jax.experimental.pallas.triton.atomic_*``: the
same functions and signatures, as generic primitives that the interpreter runs (the
reference semantics) and that backends lower. Each returns the previous values.
"""

from __future__ import annotations

from typing import Any

import jax

from pallas._src.primitives.atomics import atomic_cas, atomic_rmw


def atomic_add(x_ref_or_view, idx, val, *, mask: Any | None = None) -> jax.Array:
    """Atomically computes ``x_ref_or_view[idx] += val`` where ``mask``; returns the old values."""
    return atomic_rmw("add", x_ref_or_view, idx, val, mask=mask)


def atomic_and(x_ref_or_view, idx, val, *, mask: Any | None = None) -> jax.Array:
    """Atomically computes ``x_ref_or_view[idx] &= val`` where ``mask``; returns the old values."""
    return atomic_rmw("and", x_ref_or_view, idx, val, mask=mask)


def atomic_or(x_ref_or_view, idx, val, *, mask: Any | None = None) -> jax.Array:
    """Atomically computes ``x_ref_or_view[idx] |= val`` where ``mask``; returns the old values."""
    return atomic_rmw("or", x_ref_or_view, idx, val, mask=mask)


def atomic_xor(x_ref_or_view, idx, val, *, mask: Any | None = None) -> jax.Array:
    """Atomically computes ``x_ref_or_view[idx] ^= val`` where ``mask``; returns the old values."""
    return atomic_rmw("xor", x_ref_or_view, idx, val, mask=mask)


def atomic_max(x_ref_or_view, idx, val, *, mask: Any | None = None) -> jax.Array:
    """Atomically raises ``x_ref_or_view[idx]`` to ``val`` where ``mask``; returns the old values."""
    return atomic_rmw("max", x_ref_or_view, idx, val, mask=mask)


def atomic_min(x_ref_or_view, idx, val, *, mask: Any | None = None) -> jax.Array:
    """Atomically lowers ``x_ref_or_view[idx]`` to ``val`` where ``mask``; returns the old values."""
    return atomic_rmw("min", x_ref_or_view, idx, val, mask=mask)


def atomic_xchg(x_ref_or_view, idx, val, *, mask: Any | None = None) -> jax.Array:
    """Atomically writes ``val`` to ``x_ref_or_view[idx]`` where ``mask``; returns the old values."""
    return atomic_rmw("xchg", x_ref_or_view, idx, val, mask=mask)


__all__ = ["atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or",
           "atomic_xchg", "atomic_xor"]
