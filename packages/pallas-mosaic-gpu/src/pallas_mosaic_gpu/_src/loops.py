"""Work-distribution helpers: ``nd_loop`` (a grid split over a mesh axis),
``dynamic_scheduling_loop``, ``planar_snake`` (a locality-friendly iteration order) and
``warp_map``. They are written with ``lax`` and ``pl.core_map``, so they mean the same
in every interpreter and in the lowering."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from jax import lax

import pallas as pl
from pallas_mosaic_gpu._src.mesh import WarpMesh

_T = TypeVar("_T")

# The named scope marking a ``fori_loop`` the lowering keeps rolled (rolled_fori_loop).
ROLLED_SCOPE = "mosaic_gpu_rolled_loop"


def rolled_fori_loop(lower, upper, body: Callable, init: Any) -> Any:
    """``lax.fori_loop`` whose ``scf.for`` carries LLVM's "do not unroll" loop metadata
    (which also reaches PTX as ``.pragma "nounroll"``, for ptxas). For the pipelines'
    step loops: a step is TMA copies, barrier waits and MMAs, and unrolled steps only
    repeat them. The marker is a named scope: the loop's equation records it."""
    with jax.named_scope(ROLLED_SCOPE):
        return lax.fori_loop(lower, upper, body, init)


@dataclasses.dataclass(frozen=True, eq=False)
class NDLoopInfo:
    """One step of ``nd_loop``: ``index`` into the grid, the step number on this block
    (``local_index``) and how many steps this block runs (``num_local_steps``)."""

    index: tuple[jax.Array, ...]
    local_index: jax.Array | int
    num_local_steps: jax.Array | int | None


def _unravel(lin, grid: Sequence[Any]) -> tuple[jax.Array, ...]:
    """The indices of flat step ``lin`` in ``grid`` (row-major). ``lin`` is always in
    ``[0, prod(grid))`` here, so the outermost index is what is left of it after the
    inner dims, with no remainder (one ``rem`` fewer per step in a 1-D pipeline)."""
    if not grid:
        return ()
    out = []
    for n in reversed(grid[1:]):
        out.append(lax.rem(lin, jnp.int32(n)))
        lin = lax.div(lin, jnp.int32(n))
    out.append(lin)
    return tuple(reversed(out))


def nd_loop(grid: Sequence[int | jax.Array], *, collective_axes: Any,
            tiling: Sequence[int] | None = None, init_carry: Any = None):
    """Decorator: runs the body over ``grid``'s points, split round robin between the
    blocks along ``collective_axes`` (block ``i`` of ``n`` takes flat steps ``i``,
    ``i + n``, ...). The body takes an :class:`NDLoopInfo` (and the carry, when
    ``init_carry`` is given, returning the new one). A size of ``grid`` may be traced
    (read at run time)."""
    if tiling is not None:
        # A dimension known only at run time (a traced size) cannot be checked here.
        if len(tiling) != len(grid) or any(isinstance(g, int) and g % t
                                           for g, t in zip(grid, tiling)):
            raise ValueError(f"nd_loop(tiling={tiling}) must divide grid={tuple(grid)}")
    axes = collective_axes
    index = lax.axis_index(axes)
    size = lax.axis_size(axes)
    total = math.prod(grid) if all(isinstance(g, int) for g in grid) else jnp.prod(
        jnp.asarray(grid, jnp.int32))
    steps = lax.div(jnp.int32(total) - index + jnp.int32(size) - 1, jnp.int32(size))

    def point(lin):
        if tiling is None:
            return _unravel(lin, grid)
        tiles = [g // t for g, t in zip(grid, tiling)]
        per_tile = math.prod(tiling)
        tile_idx = _unravel(lax.div(lin, jnp.int32(per_tile)), tiles)
        within = _unravel(lax.rem(lin, jnp.int32(per_tile)), tiling)
        return tuple(t * jnp.int32(s) + w for t, s, w in zip(tile_idx, tiling, within))

    def decorator(body):
        def step(i, carry):
            info = NDLoopInfo(point(index + i * jnp.int32(size)), i, steps)
            if init_carry is None:
                body(info)
                return carry
            return body(info, carry)

        out = lax.fori_loop(jnp.int32(0), steps, step, init_carry)
        return None if init_carry is None else out

    return decorator


def dynamic_scheduling_loop(grid_names: Sequence[Hashable], thread_axis: Hashable = None,
                            cluster_axes: tuple = (), init_carry: Any = None):
    """Decorator: runs the body for this block's grid point and for any blocks it takes
    over with cluster launch control (``try_cluster_cancel``). Taking over never
    succeeds in the interpreters (all blocks run), which is one valid GPU schedule."""
    del thread_axis, cluster_axes

    def decorator(body):
        index = tuple(lax.axis_index(n) for n in grid_names)
        info = NDLoopInfo(index, jnp.int32(0), None)
        if init_carry is None:
            body(info)
            return None
        return body(info, init_carry)

    return decorator


def planar_snake(lin_idx: jax.Array, shape: tuple[Any, Any], minor_dim: int,
                 tile_width: int):
    """The 2D index of step ``lin_idx`` of a snake order over ``shape``: tiles of
    ``tile_width`` along ``minor_dim``, walked along the other dim, every other tile in
    reverse (neighbouring steps reuse neighbouring data)."""
    if minor_dim not in (0, 1):
        raise ValueError(f"planar_snake(minor_dim={minor_dim}): must be 0 or 1")
    lin = jnp.asarray(lin_idx, jnp.int32)
    width = jnp.int32(tile_width)
    major = jnp.int32(shape[1 - minor_dim])
    minor_size = jnp.int32(shape[minor_dim])
    tile = lax.div(lin, width * major)
    full_tiles = lax.div(minor_size, width)
    in_full = tile < full_tiles
    w = jnp.where(in_full, width, minor_size - full_tiles * width)
    w = jnp.maximum(w, 1)
    p = lin - tile * width * major
    minor_i = tile * width + lax.rem(p, w)
    along = lax.div(p, w)
    major_i = jnp.where(lax.rem(tile, 2) == 0, along, major - 1 - along)
    return (minor_i, major_i) if minor_dim == 0 else (major_i, minor_i)


def warp_map(f: Callable[[jax.Array], _T], /) -> _T:
    """Runs ``f(warp_id)`` on each of the 4 warps of the current warpgroup."""
    mesh = WarpMesh(axis_name=f"warp_map_{id(f)}")
    return pl.core_map(mesh)(lambda: f(lax.axis_index(mesh.axis_name)))
