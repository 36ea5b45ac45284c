"""Block index transforms: a BlockSpec being pulled backwards through a fusion.

Pulling starts from the block specs of a fusion's outputs. Each value met on the way
gets a :class:`BlockIndexTransform`: its block shape, and a function from the block
indices of the output specs to its own block indices. When the walk is done, applying
a transform to the output specs' index maps gives an ordinary BlockSpec.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from pallas._src import block_spec as bs
from pallas._src import jax_compat as jc
from pallas._src.context_vars import set_for_block
from pallas._src.fuser.compare import compare_jaxprs


def _no_block_indices(*block_indices):
    del block_indices
    return None


@dataclasses.dataclass
class BlockIndexTransform:
    """A block shape and how to compute its block indices from the output specs' ones.

    ``block_index_transform(*out_block_indices)`` receives one tuple of block indices per
    output BlockSpec of the fusion (``None`` for outputs without one).
    ``memory_space`` marks terminal values such as PRNG keys (``MemorySpace.KEY``);
    ``pipeline_mode`` is carried to the resulting BlockSpec.
    """

    block_shape: Sequence[Any] | None
    block_index_transform: Callable[..., Any] = _no_block_indices
    memory_space: Any | None = dataclasses.field(kw_only=True, default=None)
    pipeline_mode: bs.Buffered | None = dataclasses.field(kw_only=True, default=None)

    def replace(self, **kwargs) -> BlockIndexTransform:
        return dataclasses.replace(self, **kwargs)


class NoBlockIndexTransform:
    """The absence of a transform: the value is not blocked (it is passed whole)."""

    def __repr__(self) -> str:
        return "no_block_index_transform"


no_block_index_transform = NoBlockIndexTransform()

# A value that two uses pulled to different blocks (a DAG the pull cannot resolve).
CONFLICT = object()


# -- block dimensions ------------------------------------------------------------------


def block_size(dim) -> int | None:
    """The number of elements a block dim spans in the kernel; None when squeezed."""
    if dim is None or isinstance(dim, bs.Squeezed):
        return None
    if isinstance(dim, (bs.Blocked, bs.Element, bs.BoundedSlice, bs.Indirect)):
        return dim.block_size
    return int(dim)


def full_size(dim) -> int:
    """Like :func:`block_size`, but a squeezed dim spans one element."""
    size = block_size(dim)
    return 1 if size is None else size


def is_squeezed(dim) -> bool:
    return dim is None or isinstance(dim, bs.Squeezed)


def is_blocked(dim) -> bool:
    """A plain blocked dim: an int or ``pl.Blocked`` (the index map returns block indices)."""
    return isinstance(dim, bs.Blocked) or (isinstance(dim, int) and not isinstance(dim, bool))


def kernel_shape(block_shape) -> tuple[int, ...]:
    """The shape the kernel sees: squeezed dims removed."""
    return tuple(s for s in (block_size(d) for d in block_shape) if s is not None)


def block_dims_equal(a, b) -> bool:
    if a is None or b is None:
        return a is b
    if (is_blocked(a) or is_blocked(b)) and not (is_blocked(a) and is_blocked(b)):
        return False
    if is_blocked(a):
        return block_size(a) == block_size(b)
    return type(a) is type(b) and block_size(a) == block_size(b)


def block_shapes_equal(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(block_dims_equal(x, y) for x, y in zip(a, b))


def describe_block_shape(block_shape) -> str:
    if block_shape is None:
        return "None (the whole value)"
    return "(" + ", ".join("None" if d is None else str(d) for d in block_shape) + ")"


def describe(transform) -> str:
    """A short description of a transform or BlockSpec for error messages."""
    if transform is no_block_index_transform or transform is bs.no_block_spec:
        return "no_block_spec"
    if transform is CONFLICT:
        return "<conflicting block specs>"
    return f"block_shape={describe_block_shape(transform.block_shape)}"


# -- comparing transforms ----------------------------------------------------------------


def transforms_equal(t1, t2, index_avals, *, strict: bool = True) -> bool:
    """Whether two transforms give the same blocks (index functions compared as jaxprs)."""
    if t1 is t2:
        return True
    if not (isinstance(t1, BlockIndexTransform) and isinstance(t2, BlockIndexTransform)):
        return False
    if not block_shapes_equal(t1.block_shape, t2.block_shape):
        return False
    if t1.memory_space != t2.memory_space:
        return False
    if not strict or t1.block_index_transform is t2.block_index_transform:
        return True
    try:
        j1 = jax.make_jaxpr(t1.block_index_transform)(*index_avals)
        j2 = jax.make_jaxpr(t2.block_index_transform)(*index_avals)
    except Exception:  # noqa: BLE001 - an index function that cannot be traced alone
        return False
    return compare_jaxprs(j1, j2)


def index_avals_of(out_transforms) -> tuple:
    """Abstract block-index tuples (int32 scalars) of the output specs, for comparisons."""
    scalar = jc.ShapedArray((), jnp.int32)
    return tuple(
        None if t is no_block_index_transform or t.block_shape is None
        else (scalar,) * len(t.block_shape)
        for t in out_transforms
    )


# -- scalar prefetch ---------------------------------------------------------------------

_scalar_prefetch: contextvars.ContextVar = contextvars.ContextVar(
    "pallas_fuser_scalar_prefetch", default=None)


def scalar_prefetch_context(*values) -> contextlib.AbstractContextManager[None]:
    """Makes the kernel's scalar-prefetch operands visible to index functions."""
    return set_for_block(_scalar_prefetch, tuple(values))


def current_scalar_prefetch() -> tuple:
    values = _scalar_prefetch.get()
    if values is None:
        raise ValueError(
            "pallas.fuser: this index map needs the kernel's scalar-prefetch operands; call "
            "it with them after the grid indices (index_map(*grid_indices, *scalar_prefetch))"
        )
    return values


def reads_scalar_prefetch(spec):
    """``spec`` with an index map over grid indices only; it reads scalar prefetch ambiently."""
    if spec is bs.no_block_spec or spec.index_map is None:
        return spec
    index_map = spec.index_map

    def grid_only(*grid_indices):
        return index_map(*grid_indices, *current_scalar_prefetch())

    return dataclasses.replace(spec, index_map=grid_only)


def takes_scalar_prefetch(spec, grid_len: int | None):
    """``spec`` with an index map over ``(*grid_indices, *scalar_prefetch)``."""
    if spec is bs.no_block_spec or spec.index_map is None:
        return spec
    index_map = spec.index_map

    def with_prefetch(*args):
        n = len(args) if grid_len is None else grid_len
        with scalar_prefetch_context(*args[n:]):
            return index_map(*args[:n])

    return dataclasses.replace(spec, index_map=with_prefetch)


# -- from output specs and back to specs -------------------------------------------------


def as_tuple(indices) -> tuple:
    return tuple(indices) if isinstance(indices, (tuple, list)) else (indices,)


def spec_of_dims(spec, dims: Sequence[int]):
    """The block spec of the operand dims ``dims`` of ``spec``, in that order: what a
    squeeze (the kept dims), a transpose (permuted) or an unstack (one dropped) makes."""
    index_map = spec.index_map

    def new_index_map(*args):
        idx = as_tuple(index_map(*args))
        return tuple(idx[d] for d in dims)

    return bs.BlockSpec(tuple(spec.block_shape[d] for d in dims), new_index_map)


def initial_transforms(out_specs) -> tuple:
    """One transform per output spec; outputs with the same spec share one index function."""
    out = []
    first_equal: list[int] = []
    for i, spec in enumerate(out_specs):
        rep = i
        for j in range(i):
            other = out_specs[j]
            if spec is other or (
                spec is not bs.no_block_spec and other is not bs.no_block_spec
                and spec.index_map is other.index_map
                and block_shapes_equal(spec.block_shape, other.block_shape)
            ):
                rep = first_equal[j]
                break
        first_equal.append(rep)
        if spec is bs.no_block_spec:
            out.append(no_block_index_transform)
            continue
        out.append(BlockIndexTransform(
            block_shape=spec.block_shape,
            block_index_transform=(lambda k: lambda *idx: idx[k])(rep),
            pipeline_mode=spec.pipeline_mode,
        ))
    return tuple(out)


def apply_transform(out_specs, transform):
    """The BlockSpec that ``transform`` describes, over the output specs' grid arguments."""
    if transform is no_block_index_transform or transform is None:
        return bs.no_block_spec
    if transform.block_shape is None:
        return bs.BlockSpec(None, None, pipeline_mode=transform.pipeline_mode,
                            memory_space=transform.memory_space)
    fn = transform.block_index_transform

    def index_map(*grid_args):
        indices = tuple(
            None if spec is bs.no_block_spec or spec.index_map is None
            else as_tuple(spec.index_map(*grid_args))
            for spec in out_specs
        )
        return as_tuple(fn(*indices))

    return bs.BlockSpec(tuple(transform.block_shape), index_map,
                        pipeline_mode=transform.pipeline_mode,
                        memory_space=transform.memory_space)
