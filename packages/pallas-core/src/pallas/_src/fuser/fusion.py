"""``Fusion``: a fused computation handed to a fusible kernel, with its types."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

import jax

A = ParamSpec("A")
K = TypeVar("K")


def _of_leaves(tree: str, attr: str) -> property:
    """A read-only property of a :class:`Fusion`: ``attr`` (``shape``, ``dtype``) of each
    leaf of its type tree ``tree`` (``out_type`` or ``in_type``), as a tree alike."""
    return property(lambda self: jax.tree.map(lambda x: getattr(x, attr), getattr(self, tree)))


@dataclasses.dataclass
class Fusion(Generic[A, K]):
    """A function fused into a kernel: an input fusion produces an operand, an output
    fusion consumes a result. ``in_type`` is ``(args, kwargs)`` of abstract values."""

    func: Callable[A, K]
    in_type: tuple[tuple[Any, ...], dict[str, Any]]
    out_type: Any
    strict_mode: bool = True

    def __call__(self, *args: A.args, **kwargs: A.kwargs) -> K:
        return self.func(*args, **kwargs)

    @property
    def type(self):
        return self.out_type

    # The shapes and dtypes of the output and of the arguments, as trees like the types.
    shape = _of_leaves("out_type", "shape")
    dtype = _of_leaves("out_type", "dtype")
    in_shape = _of_leaves("in_type", "shape")
    in_dtype = _of_leaves("in_type", "dtype")
