"""Grids whose sizes are known only at run time (dynamic grids), and blocks whose
shapes are symbolic (``jax.export`` with ``pl.pallas_export_experimental``).

A grid size may be a traced integer scalar (computed inside ``jit``) or a symbolic
dimension (``jax.export`` shape polymorphism). Such a size is not part of the grid
mapping: the mapping's grid holds the :data:`dynamic_grid_dim` marker there, and the
size itself is an int32 scalar operand of ``pallas_call_p``, before all other operands,
as upstream. The interpreter loops to the run-time trip count; backends that claim the
``dynamic_grid`` capability receive the sizes as ``LoweringRequest.grid_bounds``.

Under ``pallas_export_experimental(dynamic_shapes=True)`` block shapes may be symbolic
too (e.g. ``(x.shape[0] // 2, 128)``): the kernel is traced on refs of symbolic shape,
the interpreter slices blocks of symbolic size, and backends that claim
``dynamic_shapes`` lower them (Mosaic TPU with placeholder sizes, as upstream).
"""

from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp

from pallas._src import jax_compat as jc
from pallas._src.context_vars import set_for_block


class DynamicGridDim:
    """The marker of a grid dimension whose size is only known at run time (a traced
    int32 scalar, or a symbolic dimension under ``jax.export``): its size is an operand
    of ``pallas_call_p``, before all others."""

    def __repr__(self) -> str:
        return "DynamicGridDim"


dynamic_grid_dim = DynamicGridDim()


def is_dynamic_grid_dim(g) -> bool:
    return g is dynamic_grid_dim


def unzip_dynamic_grid(grid) -> tuple[tuple, tuple]:
    """Splits a user grid into (grid with ``dynamic_grid_dim`` markers, dynamic sizes).

    A size is dynamic when it is a traced value (e.g. computed inside ``jit``) or a
    symbolic dimension (shape polymorphism); the sizes keep their order. Static sizes are
    checked when the grid is resolved; a traced size must be an integer scalar (or an
    array of one integer, e.g. a size read from a shape-(1,) operand, as upstream)."""
    static, bounds = [], []
    for i, g in enumerate(grid):
        if isinstance(g, jax.core.Tracer):
            aval = jax.typeof(g)
            if aval.size != 1 or not jnp.issubdtype(aval.dtype, jnp.integer):
                raise TypeError(
                    f"pallas_call grid[{i}] is a traced value of type {aval.str_short()}; a "
                    f"dynamic grid size must be an integer scalar (e.g. int32[]) or an "
                    f"array of one integer. Got grid={tuple(grid_str(d) for d in grid)}."
                )
            static.append(dynamic_grid_dim)
            bounds.append(g.reshape(()) if aval.shape != () else g)
        elif jc.is_symbolic_dim(g):
            static.append(dynamic_grid_dim)
            bounds.append(g)
        else:
            static.append(g)
    return tuple(static), tuple(bounds)


def grid_str(d) -> str:
    if isinstance(d, jax.core.Tracer):
        return jax.typeof(d).str_short()
    return str(d) if jc.is_symbolic_dim(d) else repr(d)



def refuse_dynamic_grid(params, what: str) -> None:
    """Differentiation of calls with dynamic grid sizes is refused (as upstream)."""
    gm = params["grid_mapping"]
    if gm.num_dynamic_grid_bounds:
        raise NotImplementedError(
            f"{what} of pallas_call {params['name']!r} with a dynamic grid (sizes known "
            f"only at run time: {gm.num_dynamic_grid_bounds} of the grid's {len(gm.grid)} "
            f"dimensions) is not supported; use static grid sizes, or write the "
            f"derivative with jax.custom_vjp / jax.custom_jvp")


# pl.pallas_export_experimental(dynamic_shapes=True) is active: a jax.export with
# symbolic shapes that means to keep them (upstream's flag).
_dynamic_shapes_export: contextvars.ContextVar = contextvars.ContextVar(
    "pallas_dynamic_shapes_export", default=False)


def dynamic_shapes_export(enabled: bool) -> contextlib.AbstractContextManager[None]:
    return set_for_block(_dynamic_shapes_export, bool(enabled))


def dynamic_shapes_export_enabled() -> bool:
    return _dynamic_shapes_export.get()


def check_symbolic_block(origin: str, block_shape, array_aval) -> None:
    """A block shape (``None``: the whole array) with a symbolic dimension needs
    ``pl.pallas_export_experimental(dynamic_shapes=True)``; otherwise it is upstream's
    error, naming the operand."""
    block = array_aval.shape if block_shape is None else block_shape
    dims = [getattr(d, "block_size", d) for d in block]
    if dynamic_shapes_export_enabled() or not any(jc.is_symbolic_dim(d) for d in dims):
        return
    raise ValueError(
        "shape polymorphism for Pallas does not support dynamically-shaped blocks. "
        f"Block spec for {origin} has block_shape: {tuple(str(d) for d in dims)} (array "
        f"shape {tuple(str(d) for d in array_aval.shape)}). If this is intentional, use "
        f"the pl.pallas_export_experimental(dynamic_shapes=True) context manager to "
        f"enable dynamic shapes; otherwise give the block static sizes."
    )


def grid_repr(gm) -> str:
    return "(" + ", ".join("dynamic" if g is dynamic_grid_dim else str(g)
                           for g in gm.grid) + ("," if len(gm.grid) == 1 else "") + ")"


def check_dynamic_grid_support(b, gm, name) -> None:
    """A backend lowers grids with run-time sizes only if it claims ``dynamic_grid``."""
    if "dynamic_grid" in b.capabilities or "*" in b.capabilities:
        return
    raise NotImplementedError(
        f"dynamic grid bounds not supported in the {b.title} backend: pallas_call {name} "
        f"has grid {grid_repr(gm)}, whose dynamic sizes (traced values or symbolic "
        f"dimensions) backend {b.name!r} does not lower. Use static grid sizes, or "
        f"a backend that supports them (mosaic_tpu, or interpret=True)")


def check_dynamic_shapes_support(b, gm, name) -> None:
    """A backend lowers symbolic shapes (``jax.export``) only if it claims
    ``dynamic_shapes``."""
    sym = [bm for bm in gm.block_mappings if bm.symbolic]
    if not sym or {"dynamic_shapes", "*"} & set(b.capabilities):
        return
    bm = sym[0]
    raise NotImplementedError(
        f"dynamic shapes not supported in the {b.title} "
        f"backend: pallas_call {name} operand {bm.origin} has symbolic dimensions (array "
        f"{bm.array_aval.str_short()}, block {tuple(str(d) for d in bm.block_shape)}), "
        f"which backend {b.name!r} does not lower. Export with concrete shapes, or use a "
        f"backend that supports them (mosaic_tpu, or interpret=True)")
