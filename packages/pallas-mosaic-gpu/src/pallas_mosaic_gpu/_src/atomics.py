"""Mosaic GPU's atomic stores: ``plgpu.atomic_add(ref, val)`` combines ``val`` into the
whole of ``ref`` element by element and returns nothing (pallas-core's ``pallas.atomics``
read-modify-write primitive gives the semantics)."""

from __future__ import annotations

from typing import Any

from pallas import atomics


def _whole(ref: Any) -> tuple:
    return tuple(slice(None) for _ in ref.shape)


def _store(op, name: str, ref: Any, val: Any) -> None:
    shape = tuple(getattr(val, "shape", ()))
    if shape and shape != tuple(ref.shape):
        raise ValueError(
            f"plgpu.{name}(ref, val): val has shape {shape} but the ref has shape "
            f"{tuple(ref.shape)}; they must match (or val must be a scalar)")
    op(ref, _whole(ref), val)


def atomic_add(ref: Any, val: Any) -> None:
    """Atomically adds ``val`` to ``ref`` (element-wise atomicity; float sums may vary
    in order)."""
    _store(atomics.atomic_add, "atomic_add", ref, val)


def atomic_max(ref: Any, val: Any) -> None:
    """Atomically stores ``max(ref, val)`` into ``ref``."""
    _store(atomics.atomic_max, "atomic_max", ref, val)


def atomic_min(ref: Any, val: Any) -> None:
    """Atomically stores ``min(ref, val)`` into ``ref``."""
    _store(atomics.atomic_min, "atomic_min", ref, val)


def atomic_and(ref: Any, val: Any) -> None:
    """Atomically stores ``ref & val`` into ``ref`` (integers)."""
    _store(atomics.atomic_and, "atomic_and", ref, val)


def atomic_or(ref: Any, val: Any) -> None:
    """Atomically stores ``ref | val`` into ``ref`` (integers)."""
    _store(atomics.atomic_or, "atomic_or", ref, val)


def atomic_xor(ref: Any, val: Any) -> None:
    """Atomically stores ``ref ^ val`` into ``ref`` (integers)."""
    _store(atomics.atomic_xor, "atomic_xor", ref, val)
