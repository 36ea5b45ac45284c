"""``emit_pipeline``: a grid loop inside a kernel that streams blocks of HBM refs
through VMEM.

``pltpu.emit_pipeline(body, grid=..., in_specs=..., out_specs=...)`` returns
``pipeline(*in_refs, *out_refs)``. Called inside a kernel on refs in ``ANY``/``HBM``
memory, it runs ``body(*in_blocks, *out_blocks)`` once per point of ``grid`` (row-major
order), where each block is a VMEM ref selected by its BlockSpec's index map.

Inputs are double-buffered: the DMA of the next iteration's input blocks is started
before ``body`` runs on the current ones. An output block stays in its VMEM buffer across
consecutive iterations that map to the same block (so ``body`` can accumulate into it)
and is copied back to HBM after every iteration. Only ``Blocked`` and squeezed
(``None``) block dims whose sizes divide the array are supported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax.numpy as jnp
from jax import lax

import pallas as pl
from pallas_tpu._src.memory import VMEM, SemaphoreType
from pallas_tpu._src.primitives.dma import AsyncCopyDescriptor


def _as_list(specs) -> list:
    if specs is None:
        return []
    if isinstance(specs, pl.BlockSpec):
        return [specs]
    return list(specs)


def _block_dims(spec: pl.BlockSpec, shape, what: str):
    if spec.block_shape is None:
        return [int(n) for n in shape]
    if len(spec.block_shape) != len(shape):
        raise ValueError(f"emit_pipeline {what}: block shape {spec.block_shape} does not "
                         f"match the rank of the ref {tuple(shape)}")
    dims = []
    for d, n in zip(spec.block_shape, shape):
        if d is None or isinstance(d, pl.Squeezed):
            dims.append(None)
        elif isinstance(d, int):
            if n % d:
                raise NotImplementedError(
                    f"emit_pipeline {what}: block size {d} does not divide the dimension "
                    f"{n} (edge blocks are not implemented yet in pallas-tpu)")
            dims.append(d)
        elif isinstance(d, pl.Blocked):
            dims.append(d.block_size)
        else:
            raise NotImplementedError(
                f"emit_pipeline {what}: {type(d).__name__} block dims are not implemented "
                f"yet in pallas-tpu")
    return dims


def _window(ref, spec, dims, idx):
    """``ref.at[...]`` for the block the index map selects at grid point ``idx``."""
    block_idx = spec.index_map(*idx) if spec.index_map is not None else (0,) * len(dims)
    if not isinstance(block_idx, tuple):
        block_idx = (block_idx,)
    indexers = []
    for b, d in zip(block_idx, dims):
        b = jnp.asarray(b, jnp.int32)
        indexers.append(b if d is None else pl.ds(pl.multiple_of(b * d, d), d))
    return ref.at[tuple(indexers)]


def _unravel(t, grid):
    idx = []
    for n in reversed(grid):
        idx.append(lax.rem(t, n))
        t = lax.div(t, n)
    return tuple(reversed(idx))


def emit_pipeline(body, *, grid: Sequence[int], in_specs=(), out_specs=(), tiling=None,
                  core_axis=None, core_axis_name=None, dimension_semantics=None,
                  trace_scopes=True, should_accumulate_out=False, first_cycle=None,
                  last_cycle=None, init_accumulators=None, no_pipelining=False, **unused):
    """Returns ``pipeline(*refs)`` that runs ``body`` over ``grid`` on VMEM blocks."""
    if core_axis is not None or core_axis_name is not None:
        raise NotImplementedError(
            "emit_pipeline(core_axis=...) is not implemented yet in pallas-tpu "
            "(backend 'mosaic_tpu')")
    if should_accumulate_out:
        raise NotImplementedError(
            "emit_pipeline(should_accumulate_out=True) is not implemented yet in "
            "pallas-tpu (backend 'mosaic_tpu')")
    grid = tuple(int(g) for g in grid)
    in_specs, out_specs = _as_list(in_specs), _as_list(out_specs)

    def pipeline(*refs, scratches=None, **kw):
        if len(refs) != len(in_specs) + len(out_specs):
            raise ValueError(f"the pipeline takes {len(in_specs)} input and "
                             f"{len(out_specs)} output refs; got {len(refs)} refs")
        ins, outs = refs[:len(in_specs)], refs[len(in_specs):]
        in_dims = [_block_dims(s, r.shape, f"input {i}")
                   for i, (s, r) in enumerate(zip(in_specs, ins))]
        out_dims = [_block_dims(s, r.shape, f"output {i}")
                    for i, (s, r) in enumerate(zip(out_specs, outs))]
        shape_of = lambda dims: tuple(d for d in dims if d is not None)
        types = (
            [VMEM((2, *shape_of(d)), r.dtype) for d, r in zip(in_dims, ins)]
            + [VMEM(shape_of(d), r.dtype) for d, r in zip(out_dims, outs)]
            + [SemaphoreType.DMA((2, max(len(ins), 1))), SemaphoreType.DMA((max(len(outs), 1),))]
        )
        n = math.prod(grid)

        def scoped(*bufs):
            in_bufs, out_bufs = bufs[:len(ins)], bufs[len(ins):len(ins) + len(outs)]
            in_sems, out_sems = bufs[-2], bufs[-1]

            def in_copies(t, slot):
                idx = _unravel(t, grid)
                return [AsyncCopyDescriptor(_window(r, s, d, idx), b.at[slot],
                                            in_sems.at[slot, k])
                        for k, (r, s, d, b) in enumerate(zip(ins, in_specs, in_dims, in_bufs))]

            if n:
                for c in in_copies(jnp.int32(0), 0):
                    c.start()

            def step(t, carry):
                slot = lax.rem(t, 2)

                @pl.when(t + 1 < n)
                def _():
                    for c in in_copies(t + 1, 1 - slot):
                        c.start()

                for c in in_copies(t, slot):
                    c.wait()
                body(*[b.at[slot] for b in in_bufs], *out_bufs)
                idx = _unravel(t, grid)
                for k, (r, s, d, b) in enumerate(zip(outs, out_specs, out_dims, out_bufs)):
                    c = AsyncCopyDescriptor(b, _window(r, s, d, idx), out_sems.at[k])
                    c.start()
                    c.wait()
                return carry

            lax.fori_loop(0, n, step, 0)

        pl.run_scoped(scoped, *types)

    return pipeline
