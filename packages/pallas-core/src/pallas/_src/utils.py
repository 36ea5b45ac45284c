"""Small arithmetic and array helpers of the public API (``cdiv``, ``empty``, ...)."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np

from pallas._src import jax_compat as jc
from pallas._src.dynamic_grid import dynamic_shapes_export
from pallas._src.memory import uninitialized_value
from pallas._src.primitives.control import when


def cdiv(a, b):
    """Ceiling division ``ceil(a / b)`` for ints and int arrays."""
    if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
        return -(-int(a) // int(b))
    if all(isinstance(v, (int, np.integer)) or jc.is_symbolic_dim(v) for v in (a, b)):
        return (a + b - 1) // b  # symbolic dimensions (jax.export) stay symbolic
    return jax.lax.div(a + b - 1, b)


def align_to(a, alignment):
    """Rounds ``a`` up to a multiple of ``alignment``."""
    return cdiv(a, alignment) * alignment


def next_power_of_2(x: int) -> int:
    """The smallest power of two >= ``x`` (``x >= 0``)."""
    if x < 0:
        raise ValueError(f"next_power_of_2 takes a non-negative int, got {x}")
    return 1 if x == 0 else 1 << (int(x) - 1).bit_length()


def strides_from_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major element strides of ``shape``."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def broadcast_to(a, shape: tuple[int, ...]):
    """``jnp.broadcast_to`` usable inside kernels."""
    return jnp.broadcast_to(a, shape)


def reciprocal(x, *, approx: bool = False, full_range: bool = True):
    """``1 / x``; backends may use a faster approximation when ``approx``."""
    del approx, full_range
    return 1 / x


def empty(shape, dtype, *, out_sharding=None):
    """An array whose contents are unspecified (poisoned in the interpreter)."""
    del out_sharding
    return uninitialized_value(tuple(shape), dtype)


def empty_like(x: object):
    """``empty`` with the shape and dtype of every leaf of ``x``."""
    return jax.tree_util.tree_map(lambda l: empty(jnp.shape(l), jnp.result_type(l)), x)


def empty_ref_like(x: object):
    """A new mutable ref with the shape and dtype of ``x`` (unspecified contents); of a
    memory-space type (``pltpu.SMEM((8,), jnp.int32)``), a ref in that memory space."""
    space = getattr(x, "memory_space", None)
    if space is not None and hasattr(x, "shape") and hasattr(x, "dtype"):
        return jax.new_ref(empty(tuple(x.shape), x.dtype), memory_space=space)
    return jax.new_ref(empty(jnp.shape(x), jnp.result_type(x)))


def lower_as_mlir(f, *args, dynamic_shapes=False, device=None, static_argnames=(),
                  platforms=None, **kwargs) -> str:
    """The StableHLO module of ``jax.export`` of ``jax.jit(f)`` for ``platforms``
    (default ``["tpu"]``, as upstream), under ``pallas_export_experimental(dynamic_shapes)``
    (a debugging aid: no stability guarantee)."""
    with pallas_export_experimental(dynamic_shapes):
        jit_kw = {} if device is None else {"device": device}
        jitted = jax.jit(f, static_argnames=static_argnames, **jit_kw)
        exported = jax.export.export(jitted, platforms=list(platforms or ["tpu"]))(
            *args, **kwargs)
        return exported.mlir_module()


@contextlib.contextmanager
def pallas_export_experimental(dynamic_shapes: bool):
    """Upstream's switch for exports that keep symbolic dimensions. Symbolic grid sizes
    are dynamic grid sizes with or without it; with it, a dynamically-shaped block is
    an error that says pallas-core does not lower such blocks (upstream lowers them to
    Mosaic with placeholder sizes), instead of asking for the switch."""
    with dynamic_shapes_export(dynamic_shapes):
        yield


def run_state(f):
    """Runs ``f`` on refs initialised from its argument; returns their final values."""
    return jc.state_discharge.run_state(f)


class SelectedRef:
    """The ref among ``options`` that a scalar ``index`` picks at run time (the result of
    :func:`select_ref`): option ``k`` when ``index == k``, the last one for any other
    index (as upstream's nested ``scf.if``). Operations that take one call
    :meth:`dispatch`, which runs them once per option under ``pl.when``."""

    def __init__(self, index, options):
        self.index, self.options = index, tuple(options)

    shape = property(lambda self: self.options[0].shape)
    dtype = property(lambda self: self.options[0].dtype)

    def dispatch(self, fn) -> None:
        """Calls ``fn(option)`` for the option the index picks: under ``pl.when(index ==
        k)`` for each option but the last, and for the last under its complement."""
        last = len(self.options) - 1
        for k, ref in enumerate(self.options[:-1]):
            when(self.index == k)(lambda ref=ref: fn(ref))
        when((self.index < 0) | (self.index >= last))(lambda: fn(self.options[-1]))

    def _map(self, f) -> SelectedRef:
        return SelectedRef(self.index, [f(r) for r in self.options])

    def reshape(self, *shape) -> SelectedRef:
        """Each option reshaped (``ref.reshape``)."""
        return self._map(lambda r: r.reshape(*shape))

    def bitcast(self, dtype) -> SelectedRef:
        """Each option bitcast (``ref.bitcast``)."""
        return self._map(lambda r: r.bitcast(dtype))

    @property
    def at(self):
        """``sel.at[idx]``: each option viewed at ``idx``."""
        sel = self

        class _At:
            def __getitem__(self, idx):
                return sel._map(lambda r: r.at[idx])

        return _At()

    def __getitem__(self, idx):
        raise NotImplementedError(
            "pl.select_ref's result is a DMA operand only (pltpu.async_copy, "
            "make_async_copy, make_async_remote_copy); to read or write one of several "
            "refs by a run-time index, stack them into one ref and use ref.at[idx]")

    __setitem__ = __getitem__

    def __repr__(self) -> str:
        return f"SelectedRef(index={self.index!r}, options={len(self.options)})"


def select_ref(idx, *refs) -> SelectedRef:
    """Selects one of ``refs`` by the run-time value of the scalar ``idx``: ``refs[idx]``
    for ``0 <= idx < len(refs) - 1``, the last ref otherwise (as upstream). The result
    is a DMA operand (source, destination or semaphore) of ``pltpu.async_copy`` and
    friends; an option may itself be a view (``ref.at[...]``).

    Raises ``ValueError`` for fewer than two refs or a non-scalar integer ``idx``.
    """
    if len(refs) <= 1:
        raise ValueError("At least two refs are required for pl.select_ref.")
    idx = jnp.asarray(idx)
    if idx.shape != () or not jnp.issubdtype(idx.dtype, jnp.integer):
        raise ValueError(f"pl.select_ref: the index must be an integer scalar; got "
                         f"{idx.dtype}{list(idx.shape)}")
    return SelectedRef(idx, refs)
