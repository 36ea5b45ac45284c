"""``Fusion``: a fused computation handed to a fusible kernel, with its types."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

import jax

A = ParamSpec("A")
K = TypeVar("K")


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
    def shape(self):
        return jax.tree.map(lambda x: x.shape, self.out_type)

    @property
    def dtype(self):
        return jax.tree.map(lambda x: x.dtype, self.out_type)

    @property
    def type(self):
        return self.out_type

    @property
    def in_shape(self):
        return jax.tree.map(lambda x: x.shape, self.in_type)

    @property
    def in_dtype(self):
        return jax.tree.map(lambda x: x.dtype, self.in_type)
