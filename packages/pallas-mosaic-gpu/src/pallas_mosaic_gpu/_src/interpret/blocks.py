"""``pallas_call`` with a grid and BlockSpecs in GPU interpret mode.

One thread walks the grid in order; at each step it copies the input blocks into fresh
block buffers (in the BlockSpec's memory space, SMEM by default on GPUs), runs the
kernel, and copies the output blocks back (edge blocks are padded with the fill value
and only their in-bounds part is written back). Operands whose BlockSpec is whole (e.g.
``memory_space=plgpu.GMEM``) are passed as they are.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from pallas.plugins import Blocked, BoundedSlice, Element, Squeezed
from pallas_mosaic_gpu._src.interpret.evaluator import eval_jaxpr
from pallas_mosaic_gpu._src.interpret.memory import Buffer, fill_value
from pallas_mosaic_gpu._src.memory import GMEM, SMEM


def _starts(bm, grid_indices):
    if bm.index_map_uses_prefetch:
        raise NotImplementedError(
            f"GPU interpret mode (pallas-mosaic-gpu): the index map of {bm.origin} reads "
            "scalar-prefetch operands, which is not supported yet")
    closed = bm.index_map_jaxpr
    idx = jex_core.jaxpr_as_fun(closed)(*[jnp.int32(i) for i in grid_indices])
    starts, sizes = [], []
    it = iter(idx)
    for d in bm.block_dims:
        i = int(next(it))
        if isinstance(d, Blocked):
            starts.append(i * d.block_size)
            sizes.append(d.block_size)
        elif isinstance(d, BoundedSlice):
            starts.append(i)
            sizes.append(int(next(it)))
        elif isinstance(d, (Element, Squeezed)):
            starts.append(i)
            sizes.append(d.block_size if isinstance(d, Element) else 1)
        else:
            starts.append(i * d.block_size)
            sizes.append(d.block_size)
    return starts, sizes


def _block_slices(bm, starts, sizes):
    """(slices into the array, slices into the block) of the in-bounds part."""
    arr, blk = [], []
    for s, n, full in zip(starts, sizes, bm.array_aval.shape):
        lo, hi = max(s, 0), min(s + n, full)
        hi = max(hi, lo)
        arr.append(slice(lo, hi))
        blk.append(slice(lo - s, hi - s))
    return tuple(arr), tuple(blk)


def _ref_shape(bm, sizes):
    return tuple(n for d, n in zip(bm.block_dims, sizes) if not isinstance(d, Squeezed))


def run_grid(th, jaxpr, gm, prefetch, ins, outs):
    """Generator: the kernel at every grid point, with block copies around it."""
    launch = th.launch
    buffers = [*ins, *outs]
    prefetch = [Buffer(f"scalar prefetch {i}", SMEM, x) for i, x in enumerate(prefetch)]
    scratch = [launch.allocate(th, t, f"scratch {o}", ("__scratch__", i), ())
               for i, (t, o) in enumerate(zip(gm.scratch_types, gm.scratch_origins))]
    grid = tuple(gm.grid)
    n_in = gm.num_inputs
    points = np.ndindex(*grid) if grid else [()]
    for point in points:
        point = tuple(int(i) for i in point)
        th.grid_indices = point
        th.coords = dict(zip(gm.grid_names or (), point))
        args, copies = [], []
        for k, (bm, buf) in enumerate(zip(gm.block_mappings, buffers)):
            if bm.whole:
                args.append(buf)
                continue
            starts, sizes = _starts(bm, point)
            shape = tuple(sizes)
            dtype = bm.array_aval.dtype
            block = np.full(shape, np.asarray(fill_value(dtype,
                                                         launch.params.uninitialized_memory)))
            a_sl, b_sl = _block_slices(bm, starts, sizes)
            block[b_sl] = np.asarray(buf.value)[a_sl]
            space = bm.memory_space if bm.memory_space is not None else SMEM
            blk = Buffer(f"block of {bm.origin}", space,
                         jnp.asarray(block).reshape(_ref_shape(bm, sizes)))
            args.append(blk)
            if k >= n_in:
                copies.append((buf, blk, a_sl, b_sl, shape))
        yield from eval_jaxpr(th, jaxpr, (), [*prefetch, *args, *scratch])
        for buf, blk, a_sl, b_sl, shape in copies:
            host = np.array(buf.value)
            host[a_sl] = np.asarray(blk.value).reshape(shape)[b_sl]
            buf.value = jnp.asarray(host)


__all__ = ["GMEM", "run_grid"]
