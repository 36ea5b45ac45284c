"""``einshape``: reshape and transpose an array as an equation such as ``"m(nk)->nmk"`` says.

Parenthesised names on the left are split out of one dimension (give all but one of
their sizes as keyword arguments), names are reordered, and parenthesised names on the
right are merged into one dimension. The equation becomes a list of shape transforms
(:class:`SplitDims`, :class:`Transpose`, :class:`MergeDims`) that a backend may lower
one by one; :func:`einshape` applies them with ``reshape`` and ``transpose``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp

__all__ = ["MergeDims", "SplitDims", "Transform", "Transpose", "einshape",
           "get_einshape_transforms"]


@dataclasses.dataclass(frozen=True)
class SplitDims:
    """Dimension ``index`` becomes the dimensions ``sizes``."""

    index: int
    sizes: tuple[int, ...]

    def transform_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (*shape[:self.index], *self.sizes, *shape[self.index + 1:])


@dataclasses.dataclass(frozen=True)
class MergeDims:
    """The ``count`` dimensions from ``index`` on become one."""

    index: int
    count: int

    def transform_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        merged = math.prod(shape[self.index:self.index + self.count])
        return (*shape[:self.index], merged, *shape[self.index + self.count:])


@dataclasses.dataclass(frozen=True)
class Transpose:
    """Dimension ``i`` of the result is dimension ``permutation[i]`` of the input."""

    permutation: tuple[int, ...]

    def transform_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(shape[i] for i in self.permutation)


Transform = SplitDims | MergeDims | Transpose


def _parse_side(equation: str, side: str) -> list[list[str]]:
    """``"a(bc)d"`` -> ``[["a"], ["b", "c"], ["d"]]``."""
    groups: list[list[str]] = []
    rest = side.replace(" ", "")
    while rest:
        if rest[0] == "(":
            close = rest.find(")")
            if close < 0 or "(" in rest[1:close]:
                raise ValueError(f"Unmatched parenthesis in {side!r} (einshape {equation!r})")
            group, rest = list(rest[1:close]), rest[close + 1:]
            if not group:
                raise ValueError(f"Empty group () in {side!r} (einshape {equation!r})")
        elif rest[0] == ")":
            raise ValueError(f"Unmatched parenthesis in {side!r} (einshape {equation!r})")
        else:
            group, rest = [rest[0]], rest[1:]
        for name in group:
            if not name.isalpha():
                raise ValueError(f"einshape {equation!r}: {name!r} is not a dimension name "
                                 "(use letters)")
        groups.append(group)
    return groups


def _parse(equation: str) -> tuple[list[list[str]], list[list[str]]]:
    if equation.count("->") != 1:
        raise ValueError(f"Equation must contain exactly one '->': {equation!r}")
    lhs, rhs = equation.split("->")
    lg, rg = _parse_side(equation, lhs), _parse_side(equation, rhs)
    for side, groups in (("left", lg), ("right", rg)):
        names = [n for g in groups for n in g]
        if len(set(names)) != len(names):
            raise ValueError(f"einshape {equation!r}: a name repeats on the {side} side")
    return lg, rg


def _dim_sizes(equation: str, lhs: list[list[str]], shape: tuple[int, ...],
               sizes: dict[str, int]) -> dict[str, int]:
    """The size of every name on the left, from ``shape`` and the given ``sizes``."""
    if len(lhs) != len(shape):
        raise ValueError(f"Equation LHS has {len(lhs)} groups but input has {len(shape)} dims. "
                         f"LHS: {lhs}, Input shape: {tuple(shape)} (einshape {equation!r})")
    dims: dict[str, int] = {}
    for group, n in zip(lhs, shape):
        if len(group) == 1:
            name = group[0]
            if name in sizes and sizes[name] != n:
                raise ValueError(f"Inconsistent size for {name}: {sizes[name]} vs {n} "
                                 f"(einshape {equation!r})")
            dims[name] = n
            continue
        known = math.prod(sizes[a] for a in group if a in sizes)
        unknown = [a for a in group if a not in sizes]
        if not unknown:
            if known != n:
                raise ValueError(f"Size mismatch for group {group}: expected {n}, got {known} "
                                 f"(einshape {equation!r})")
        elif len(unknown) > 1:
            raise ValueError(f"Ambiguous split for {group} with size {n}. Unknowns: {unknown}. "
                             f"Provide sizes via kwargs (einshape {equation!r}).")
        elif known == 0 or n % known:
            raise ValueError(f"Cannot split size {n} with known sizes {known} "
                             f"(einshape {equation!r}, group {group})")
        dims.update({a: sizes.get(a, n // max(known, 1)) for a in group})
    return dims


def get_einshape_transforms(equation: str, input_shape: tuple[int, ...],
                            **sizes: int) -> list[Transform]:
    """The transforms that turn an array of ``input_shape`` into ``equation``'s result:
    the splits of the left side's groups (left to right), one transpose if the order
    changes, then the merges of the right side's groups (left to right). Each transform's
    indices refer to the shape its predecessors produce."""
    lhs, rhs = _parse(equation)
    dims = _dim_sizes(equation, lhs, tuple(input_shape), sizes)
    left = [n for g in lhs for n in g]
    right = [n for g in rhs for n in g]
    if sorted(left) != sorted(right):
        missing = sorted(set(right) - set(left)) or sorted(set(left) - set(right))
        raise ValueError(f"einshape {equation!r}: both sides must name the same dimensions; "
                         f"{missing} appear(s) on one side only")
    ops: list[Transform] = []
    at = 0
    for group in lhs:
        if len(group) > 1:
            ops.append(SplitDims(at, tuple(dims[a] for a in group)))
        at += len(group)
    if left != right:
        ops.append(Transpose(tuple(left.index(a) for a in right)))
    for i, group in enumerate(rhs):
        if len(group) > 1:
            ops.append(MergeDims(i, len(group)))
    return ops


def einshape(equation: str, x: Any, **sizes: int) -> Any:
    """Reshapes and transposes ``x`` as ``equation`` says (see the module docstring)."""
    x = jnp.asarray(x)
    for op in get_einshape_transforms(equation, x.shape, **sizes):
        if isinstance(op, Transpose):
            x = jnp.transpose(x, op.permutation)
        else:
            x = x.reshape(op.transform_shape(x.shape))
    return x
