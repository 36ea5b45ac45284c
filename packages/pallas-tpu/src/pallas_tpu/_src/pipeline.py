"""``emit_pipeline``: a grid loop inside a kernel that streams blocks of HBM refs
through VMEM.

``pltpu.emit_pipeline(body, grid=..., in_specs=..., out_specs=...)`` returns
``pipeline(*in_refs, *out_refs)``. Called inside a kernel on refs in ``ANY``/``HBM``
memory, it runs ``body(*in_blocks, *out_blocks)`` once per point of ``grid`` (row-major
order), where each block is a VMEM ref selected by its BlockSpec's index map (an SMEM
ref for a spec in SMEM or in ``pl.MemorySpace.KEY``, where a PRNG key operand goes).

Inputs and outputs are double-buffered: the DMA of the next iteration's input blocks is
started before ``body`` runs on the current ones. An output block stays in its VMEM
buffer across consecutive iterations that map to the same block (so ``body`` can
accumulate into it); when the next iteration maps to another block (or at the last one)
its copy back to HBM is started, and the next block is written into the other buffer
while it runs (that buffer's own copy, started one block earlier, is waited for first). ``Blocked`` and squeezed (``None``)
block dims are supported (a block size that does not divide the array leaves a last
block over the edge, of which only the part inside the array is copied, by DMAs of
static sizes under conditions), ``pl.Element(n)`` dims
without padding (the index map returns the window's element offset), and
``pl.BoundedSlice(n)`` dims (the index map returns ``pl.ds(start, size)``, ``size <= n``
known at trace time or only at run time: the block's buffer holds ``n`` rows, of which
the first ``size`` are copied in, and out for an output).

``emit_pipeline_with_allocations`` returns the same pipeline together with
``make_allocations(*refs)``, which describes the pipeline's VMEM buffers and DMA
semaphores as one :class:`BufferedRef` per operand. Allocated once at the top of a kernel
(``pl.run_scoped(lambda allocs: ..., make_allocations(*refs))``), they can be reused by
several invocations of the pipeline: ``pipeline(*refs, allocations=allocs)``.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas as pl
from pallas.core import GridAxis, grid_env
from pallas.plugins import MemoryRef, array_dtype
from pallas_tpu._src.compiler_params import GridDimensionSemantics, canonical_semantics
from pallas_tpu._src.enums import BufferType
from pallas_tpu._src.memory import MemorySpace, SemaphoreType, canonical_space
from pallas_tpu._src.primitives.dma import AsyncCopyDescriptor


def _as_list(specs) -> list:
    if specs is None:
        return []
    if isinstance(specs, pl.BlockSpec):
        return [specs]
    return list(specs)


class _ElementSize(int):
    """The size of a ``pl.Element`` dim: its index-map value is an element offset."""


class _BoundedSize(int):
    """The bound of a ``pl.BoundedSlice`` dim: its index-map value is ``pl.ds(start,
    size)`` with ``size`` at most the bound, the rows the block's buffer holds."""


class _EdgeBlocked(int):
    """The size of a ``Blocked`` dim that does not divide the array's ``extent``: the
    last block hangs over the edge, and only its rows inside the array are copied."""

    def __new__(cls, size: int, extent: int):
        self = super().__new__(cls, size)
        self.extent = int(extent)
        return self


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
        elif isinstance(d, int | pl.Blocked):
            size = d if isinstance(d, int) else d.block_size
            dims.append(_EdgeBlocked(size, n) if n % size else size)
        elif isinstance(d, pl.Element) and d.padding == (0, 0):
            dims.append(_ElementSize(d.block_size))
        elif isinstance(d, pl.BoundedSlice):
            dims.append(_BoundedSize(d.block_size))
        elif isinstance(d, pl.Element):
            raise NotImplementedError(
                f"emit_pipeline {what}: {d} block dims with padding are not implemented "
                f"yet in pallas-tpu (backend 'mosaic_tpu'); pad the array instead")
        else:
            raise NotImplementedError(
                f"emit_pipeline {what}: {type(d).__name__} block dims are not implemented "
                f"yet in pallas-tpu")
    return dims


def _block_index(spec, dims, idx, what: str) -> list:
    """The index map's value at grid point ``idx``, one entry per block dim: an int32
    scalar, or ``(start, size)`` in elements for a ``BoundedSlice`` dim and for a
    ``Blocked`` dim with an edge block (its size is cut at the array's edge)."""
    block_idx = spec.index_map(*idx) if spec.index_map is not None else (0,) * len(dims)
    if not isinstance(block_idx, tuple):
        block_idx = (block_idx,)
    out = []
    for i, (b, d) in enumerate(zip(block_idx, dims)):
        if isinstance(d, _BoundedSize):
            if not isinstance(b, pl.Slice):
                raise ValueError(
                    f"emit_pipeline {what}: Must return a pl.ds from the index_map for a "
                    f"BoundedSlice dimension. Dim {i} is BoundedSlice({int(d)}) but the "
                    f"index map returned {b!r}")
            size = b.size
            if isinstance(size, int | np.integer) and not 0 <= size <= d:
                raise ValueError(
                    f"emit_pipeline {what}: the pl.ds of BoundedSlice dim {i} has size "
                    f"{int(size)}, outside the bound [0, {int(d)}]")
            out.append((jnp.asarray(b.start, jnp.int32), size))
        elif isinstance(b, pl.Slice):
            raise ValueError(f"emit_pipeline {what}: the index map returned a pl.ds for "
                             f"dim {i}; only BoundedSlice dims take one")
        elif isinstance(d, _EdgeBlocked):
            start = jnp.asarray(b, jnp.int32) * int(d)
            out.append((start, jnp.clip(d.extent - start, 0, int(d))))
        else:
            out.append(jnp.asarray(b, jnp.int32))
    return out


def _full_bound(size, d) -> bool:
    return isinstance(size, int | np.integer) and int(size) == int(d)


def _window(ref, block, dims, sizes):
    """``ref.at[...]`` for ``block`` (see :func:`_block_index`); ``sizes`` gives each
    edge-blocked dim's static size in this variant (see :func:`_variants`)."""
    indexers = []
    for i, (b, d) in enumerate(zip(block, dims)):
        if d is None:
            indexers.append(b)
        elif isinstance(d, _EdgeBlocked):
            indexers.append(pl.ds(b[0], sizes[i]))
        elif isinstance(b, tuple):  # BoundedSlice
            indexers.append(pl.ds(b[0], b[1]))
        elif isinstance(d, _ElementSize):
            indexers.append(pl.ds(b, int(d)))
        else:
            indexers.append(pl.ds(pl.multiple_of(b * d, d), d))
    return ref.at[tuple(indexers)]


def _slot_window(buf, slot, block, dims, sizes):
    """Slot ``slot`` of an operand's buffers, as much of it as ``block`` fills: a
    ``BoundedSlice`` dim's first ``size`` rows, an edge block's rows inside the array
    (one indexer, so that a DMA of run-time size sees a plain view)."""
    if not any(isinstance(d, _BoundedSize | _EdgeBlocked) for d in dims):
        return buf.at[slot]
    indexers = [slot]
    for i, (b, d) in enumerate(zip(block, dims)):
        if d is None:
            continue
        size = sizes[i] if isinstance(d, _EdgeBlocked) else b[1] if isinstance(b, tuple) \
            else d
        indexers.append(slice(None) if _full_bound(size, d) else pl.ds(0, size))
    return buf.at[tuple(indexers)]


def _variants(block, dims) -> list:
    """``[(condition, sizes)]``: the static sizes of the edge-blocked dims under each
    condition (a block inside the array is whole; the last one is cut at the edge), so
    that every DMA has a static size, which Mosaic needs along tiled dims."""
    out = [(None, {})]
    for i, (b, d) in enumerate(zip(block, dims)):
        if not isinstance(d, _EdgeBlocked):
            continue
        inside = b[0] + int(d) <= d.extent
        out = [(c2 if c is None else c & c2, {**sz, i: n})
               for c, sz in out for c2, n in ((inside, int(d)),
                                              (~inside, d.extent % int(d)))]
    return out


@dataclasses.dataclass(frozen=True)
class _Copy:
    """The DMA of one operand's block at one step, started or waited for as the
    variant (:func:`_variants`) that holds: ``make(sizes)`` is its descriptor."""

    make: Any
    variants: list

    def _each(self, method: str) -> None:
        for cond, sizes in self.variants:
            if cond is None:
                getattr(self.make(sizes), method)()
            else:
                pl.when(cond)(lambda sizes=sizes: getattr(self.make(sizes), method)())

    def start(self) -> None:
        self._each("start")

    def wait(self) -> None:
        self._each("wait")


def _copy(ref, spec, dims, idx, buf, slot, sem, what: str, to_buffer: bool) -> _Copy:
    """The DMA between the block of ``ref`` at grid point ``idx`` and slot ``slot`` of
    its buffers (into them if ``to_buffer``)."""
    block = _block_index(spec, dims, idx, what)

    def make(sizes):
        hbm, vmem = _window(ref, block, dims, sizes), _slot_window(buf, slot, block, dims,
                                                                   sizes)
        src, dst = (hbm, vmem) if to_buffer else (vmem, hbm)
        return AsyncCopyDescriptor(src, dst, sem)

    return _Copy(make, _variants(block, dims))


def _differs(spec, dims, idx, other) -> jax.Array:
    """Whether the index map of ``spec`` selects another block at grid point ``other``
    than at ``idx``."""
    if spec.index_map is None:
        return jnp.bool_(False)
    out = jnp.bool_(False)
    for x, y in zip(_block_index(spec, dims, idx, "output"),
                    _block_index(spec, dims, other, "output")):
        for u, v in zip(*((x, y) if isinstance(x, tuple) else ((x,), (y,)))):
            out = out | (jnp.asarray(u, jnp.int32) != jnp.asarray(v, jnp.int32))
    return out


def _unravel_local(t, grid):
    idx = []
    for n in reversed(grid):
        idx.append(lax.rem(t, n))
        t = lax.div(t, n)
    return tuple(reversed(idx))


def _is_alloc_type(x) -> bool:
    return isinstance(x, MemoryRef) or hasattr(x, "get_memory_ref")


class BufferedRefBase(abc.ABC):
    """The interface of a pipelined operand's buffers (see :class:`BufferedRef`)."""

    @property
    @abc.abstractmethod
    def spec(self) -> pl.BlockSpec: ...

    @property
    @abc.abstractmethod
    def buffer_type(self) -> BufferType: ...

    @property
    def is_input(self) -> bool:
        return self.buffer_type in (BufferType.INPUT, BufferType.INPUT_OUTPUT)

    @property
    def is_output(self) -> bool:
        return self.buffer_type in (BufferType.OUTPUT, BufferType.ACCUMULATOR,
                                    BufferType.INPUT_OUTPUT)

    @property
    def is_input_output(self) -> bool:
        return self.buffer_type == BufferType.INPUT_OUTPUT

    @property
    def is_manual(self) -> bool:
        return self.buffer_type == BufferType.MANUAL

    @property
    def block_shape(self):
        return self.spec.block_shape

    @property
    def has_allocated_buffer(self) -> bool:
        """Whether the buffers were allocated outside the pipeline loop."""
        return False

    def with_spec(self, spec: pl.BlockSpec) -> BufferedRefBase:
        """A copy with the given block spec."""
        return dataclasses.replace(self, _spec=spec)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BufferedRef(BufferedRefBase):
    """The VMEM (or SMEM) buffer(s) and DMA semaphores of one pipelined operand.

    Built (before allocation) by :meth:`input`/:meth:`output`/:meth:`create`, its
    ``window_ref`` and ``sems`` are allocation types (``VMEM(...)``,
    ``SemaphoreType.DMA(...)``); passed through ``pl.run_scoped`` they become refs.
    Inputs and outputs have ``buffer_count`` (2) slots along a leading dim.
    """

    _spec: pl.BlockSpec = dataclasses.field(metadata=dict(static=True))
    _buffer_type: BufferType = dataclasses.field(metadata=dict(static=True))
    _buffer_count: int = dataclasses.field(metadata=dict(static=True))
    dtype: Any = dataclasses.field(metadata=dict(static=True))
    window_ref: Any  # VMEM or SMEM buffers: (buffer_count, *block)
    sems: Any  # DMA semaphores, one per slot

    @property
    def spec(self) -> pl.BlockSpec:
        return self._spec

    @property
    def buffer_type(self) -> BufferType:
        return self._buffer_type

    @property
    def buffer_count(self) -> int:
        return self._buffer_count

    @property
    def has_allocated_buffer(self) -> bool:
        return not _is_alloc_type(self.window_ref)

    @property
    def is_buffered(self) -> bool:
        return True

    @classmethod
    def create(cls, spec: pl.BlockSpec, dtype_or_type, buffer_type: BufferType,
               buffer_count: int = 2, *, shape=None) -> BufferedRef:
        """The allocation types for an operand of ``shape`` (and ``dtype``) under ``spec``."""
        if buffer_type not in (BufferType.INPUT, BufferType.OUTPUT):
            raise NotImplementedError(
                f"BufferedRef with buffer type {buffer_type.name} is not implemented yet in "
                f"pallas-tpu (backend 'mosaic_tpu'); INPUT and OUTPUT are")
        if buffer_count != 2:
            raise NotImplementedError(
                f"BufferedRef(buffer_count={buffer_count}) is not implemented yet in "
                f"pallas-tpu (backend 'mosaic_tpu'); operands are double-buffered")
        dtype = getattr(dtype_or_type, "dtype", dtype_or_type)
        shape = getattr(dtype_or_type, "shape", None) if shape is None else shape
        if spec.block_shape is None and shape is None:
            raise ValueError("BufferedRef.create needs the operand's shape when the "
                             "BlockSpec has no block_shape (pass a ref or ShapeDtypeStruct)")
        dims = _block_dims(spec, shape if shape is not None else
                           [d if isinstance(d, int) else getattr(d, "block_size", 1)
                            for d in spec.block_shape], "operand")
        block = tuple(d for d in dims if d is not None)
        space = _buffer_space(spec)
        return cls(spec, buffer_type, buffer_count, array_dtype(dtype),
                   space((buffer_count, *block), dtype), SemaphoreType.DMA((buffer_count,)))

    @classmethod
    def input(cls, spec: pl.BlockSpec, dtype_or_type, buffer_count: int = 2,
              **kw) -> BufferedRef:
        return cls.create(spec, dtype_or_type, BufferType.INPUT, buffer_count, **kw)

    @classmethod
    def output(cls, spec: pl.BlockSpec, dtype_or_type, buffer_count: int = 2,
               **kw) -> BufferedRef:
        return cls.create(spec, dtype_or_type, BufferType.OUTPUT, buffer_count, **kw)

    def current_ref(self, slot=0):
        """The VMEM block the body sees (slot ``slot`` of the operand's buffers)."""
        return self.window_ref.at[slot]


def _buffer_space(spec: pl.BlockSpec) -> MemorySpace:
    """Where an operand's buffers live: SMEM for a spec in SMEM, or in ``pl.MemorySpace.KEY``
    (PRNG keys, which the core reads as scalars from SMEM, as a kernel's key operand);
    VMEM otherwise."""
    space = getattr(spec, "memory_space", None)
    if space is pl.MemorySpace.KEY:
        return MemorySpace.SMEM
    try:
        space = canonical_space(space)
    except ValueError:  # not a TPU memory space: buffered in VMEM, as other specs
        return MemorySpace.VMEM
    return MemorySpace.SMEM if space is MemorySpace.SMEM else MemorySpace.VMEM


def _check_allocations(allocations, in_specs, out_specs, refs):
    allocations = list(allocations)
    if len(allocations) != len(refs):
        raise ValueError(f"the pipeline has {len(refs)} operands; got {len(allocations)} "
                         f"allocations")
    for k, (a, r) in enumerate(zip(allocations, refs)):
        if not isinstance(a, BufferedRef):
            raise TypeError(f"allocation {k} is a {type(a).__name__}, not a BufferedRef "
                            f"(use make_allocations from emit_pipeline_with_allocations)")
        if a.is_input != (k < len(in_specs)):
            raise ValueError(f"allocation {k} is an {a.buffer_type.name} buffer for an "
                             f"{'input' if k < len(in_specs) else 'output'} operand")
        if not a.has_allocated_buffer:
            raise ValueError("allocations must be allocated (pass make_allocations(...) "
                             "through pl.run_scoped) before the pipeline uses them")
        block = tuple(a.window_ref.shape[1:])
        spec = (list(in_specs) + list(out_specs))[k]
        want = tuple(d for d in _block_dims(spec, r.shape, f"operand {k}") if d is not None)
        if block != want or array_dtype(a.window_ref.dtype) != array_dtype(r.dtype):
            raise ValueError(f"allocation {k} holds {a.window_ref.dtype}{list(block)} blocks "
                             f"but the operand needs {r.dtype}{list(want)}")
    return allocations


def make_pipeline_allocations(*refs, in_specs=(), out_specs=(),
                              should_accumulate_out=False):
    """One :class:`BufferedRef` (allocation types) per operand of the pipeline."""
    if should_accumulate_out:
        raise NotImplementedError(
            "make_pipeline_allocations(should_accumulate_out=True) is not implemented yet "
            "in pallas-tpu (backend 'mosaic_tpu')")
    in_specs, out_specs = _as_list(in_specs), _as_list(out_specs)
    if len(refs) != len(in_specs) + len(out_specs):
        raise ValueError(f"the pipeline takes {len(in_specs)} input and {len(out_specs)} "
                         f"output refs; got {len(refs)} refs")
    ins, outs = refs[:len(in_specs)], refs[len(in_specs):]
    n = len(in_specs)
    # An operand that passes through unbuffered (a spec in ANY/HBM memory) has none.
    return ([None if _passes_through(s, k) else BufferedRef.input(s, r.dtype, shape=r.shape)
             for k, (s, r) in enumerate(zip(in_specs, ins))]
            + [None if _passes_through(s, n + k) else
               BufferedRef.output(s, r.dtype, shape=r.shape)
               for k, (s, r) in enumerate(zip(out_specs, outs))])


def emit_pipeline(body, *, grid: Sequence[int], in_specs=(), out_specs=(), tiling=None,
                  core_axis=None, core_axis_name=None, dimension_semantics=None,
                  trace_scopes=True, should_accumulate_out=False, first_cycle=None,
                  last_cycle=None, init_accumulators=None, no_pipelining=False, **unused):
    """Returns ``pipeline(*refs)`` that runs ``body`` over ``grid`` on VMEM blocks.

    Each entry of ``in_specs``/``out_specs`` may be a pytree of BlockSpecs; its operand is
    then the same pytree of refs, and ``body`` gets the same pytree of block refs.
    """
    ins_l, outs_l = _as_list(in_specs), _as_list(out_specs)
    # Pytrees of specs, and operands passed through unbuffered, reduce to the flat
    # pipeline over buffered operands, called again with the same options.
    wrapper = (_pytree_pipeline if not all(_is_spec(s) for s in ins_l + outs_l) else
               _through_pipeline if any(_passes_through(s, k)
                                        for k, s in enumerate(ins_l + outs_l)) else None)
    if wrapper is not None:
        return wrapper(
            body, ins_l, outs_l, grid=grid, tiling=tiling, core_axis=core_axis,
            core_axis_name=core_axis_name, dimension_semantics=dimension_semantics,
            trace_scopes=trace_scopes, should_accumulate_out=should_accumulate_out,
            first_cycle=first_cycle, last_cycle=last_cycle,
            init_accumulators=init_accumulators, no_pipelining=no_pipelining, **unused)
    if core_axis is not None and core_axis_name is not None:
        raise ValueError("core_axis and core_axis_name cannot both be provided.")
    cores = core_axis_name if core_axis is None else core_axis
    if should_accumulate_out:
        raise NotImplementedError(
            "emit_pipeline(should_accumulate_out=True) is not implemented yet in "
            "pallas-tpu (backend 'mosaic_tpu')")
    full_grid = grid = tuple(_grid_size(g) for g in grid)
    if any(isinstance(g, int) and g <= 0 for g in grid):
        raise ValueError(f"emit_pipeline: All elements in the grid must be strictly "
                         f"positive; got grid {grid}")
    dynamic = any(not isinstance(g, int) for g in grid)
    in_specs, out_specs = _as_list(in_specs), _as_list(out_specs)

    def pipeline(*refs, scratches=None, allocations=None, **kw):
        if len(refs) != len(in_specs) + len(out_specs):
            raise ValueError(f"the pipeline takes {len(in_specs)} input and "
                             f"{len(out_specs)} output refs; got {len(refs)} refs")
        unsupported = [k for k, v in kw.items() if v is not None]
        if scratches:
            unsupported.insert(0, "scratches")
        if unsupported:
            raise NotImplementedError(
                f"calling an emit_pipeline pipeline with {', '.join(unsupported)}=... is not "
                f"implemented yet in pallas-tpu (backend 'mosaic_tpu')")
        if allocations is None:
            pl.run_scoped(lambda allocs: pipeline(*refs, allocations=allocs),
                          make_pipeline_allocations(*refs, in_specs=in_specs,
                                                    out_specs=out_specs))
            return
        allocations = _check_allocations(allocations, in_specs, out_specs, refs)
        grid, offsets = _partition_grid(full_grid, cores, dimension_semantics)

        def _unravel(t, grid):  # this core's share of the grid: its blocks' indices
            return tuple(i + o for i, o in zip(_unravel_local(t, grid), offsets))

        ins, outs = refs[:len(in_specs)], refs[len(in_specs):]
        in_dims = [_block_dims(s, r.shape, f"input {i}")
                   for i, (s, r) in enumerate(zip(in_specs, ins))]
        out_dims = [_block_dims(s, r.shape, f"output {i}")
                    for i, (s, r) in enumerate(zip(out_specs, outs))]
        n = math.prod(grid) if not dynamic else _traced_prod(grid)
        in_allocs, out_allocs = allocations[:len(ins)], allocations[len(ins):]
        in_bufs = [a.window_ref for a in in_allocs]
        out_bufs = [a.window_ref for a in out_allocs]

        def in_copies(t, slot):
            idx = _unravel(t, grid)
            return [_copy(r, s, d, idx, b, slot, a.sems.at[slot], f"input {k}", True)
                    for k, (r, s, d, b, a) in enumerate(
                        zip(ins, in_specs, in_dims, in_bufs, in_allocs))]

        if dynamic:
            @pl.when(n > 0)
            def _():
                for c in in_copies(jnp.int32(0), 0):
                    c.start()
        elif n:
            for c in in_copies(jnp.int32(0), 0):
                c.start()

        def out_copy(k, t, slot):
            r, s, d, b, a = outs[k], out_specs[k], out_dims[k], out_bufs[k], out_allocs[k]
            return _copy(r, s, d, _unravel(t, grid), b, slot, a.sems.at[slot],
                         f"output {k}", False)

        def write_out(moves, k, t, o, t_other):
            """When the block of output ``k`` moves: its copy from slot ``o`` starts, and
            the other slot's copy in flight (started at step ``t_other``) is waited for."""
            @pl.when(moves)
            def _():
                out_copy(k, t, o).start()

                @pl.when(t_other >= 0)
                def _():
                    out_copy(k, t_other, 1 - o).wait()

        def wait_out(k, slot, started):
            @pl.when(started >= 0)
            def _():
                out_copy(k, started, slot).wait()

        def step(t, carry):
            slot = lax.rem(t, 2)

            @pl.when(t + 1 < n)
            def _():
                for c in in_copies(t + 1, 1 - slot):
                    c.start()

            for c in in_copies(t, slot):
                c.wait()
            # Per output: its buffer slot, and for each slot the step whose block its copy
            # in flight writes out (-1: none), to wait for exactly that copy.
            idx, nxt = _unravel(t, grid), _unravel(jnp.minimum(t + 1, n - 1), grid)
            # In the body, pl.program_id/num_programs are the pipeline's on this core
            # (as upstream: without the core's offset).
            with grid_env([GridAxis(i, g) for i, g in zip(_unravel_local(t, grid), grid)]):
                body(*[b.at[slot] for b in in_bufs],
                     *[b.at[o] for b, (o, _, _) in zip(out_bufs, carry)])
            new = []
            for k, (o, t0, t1) in enumerate(carry):
                moves = (t + 1 >= n) | _differs(out_specs[k], out_dims[k], idx, nxt)
                write_out(moves, k, t, o, jnp.where(o == 0, t1, t0))
                new.append((jnp.where(moves, 1 - o, o),
                            jnp.where(moves, jnp.where(o == 0, t, -1), t0),
                            jnp.where(moves, jnp.where(o == 1, t, -1), t1)))
            return tuple(new)

        zero, none = jnp.int32(0), jnp.int32(-1)
        init = tuple((zero, none, none) for _ in outs)
        final = lax.fori_loop(zero if dynamic else 0, n, step, init)
        for k, (o, t0, t1) in enumerate(final):
            # The last step moved the block, waiting for the other buffer's copy: only the
            # copy from the buffer before the last switch can still be in flight.
            wait_out(k, 1 - o, jnp.where(o == 0, t1, t0))

    return pipeline


def _is_spec(x) -> bool:
    return x is None or isinstance(x, pl.BlockSpec) or x is pl.no_block_spec


def _passes_through(spec, k: int) -> bool:
    """Whether operand ``k``'s spec keeps it where it is (``memory_space`` ANY or HBM and
    no block shape): the body then gets the operand's ref itself, with no buffer or
    copy, as upstream's pipeline does when the spec's memory space is the source's (say
    an HBM table that the body gathers from by DMA)."""
    del k
    if spec is None or spec is pl.no_block_spec or spec.block_shape is not None:
        # (A spec in ANY/HBM with a block shape keeps its blocks buffered through VMEM.)
        return False
    try:
        space = canonical_space(getattr(spec, "memory_space", None))
    except ValueError:  # not a TPU memory space: left to the buffered path's checks
        return False
    return space in (MemorySpace.ANY, MemorySpace.HBM)


def _through_pipeline(body, in_specs: list, out_specs: list, **kw):
    """``emit_pipeline`` where some operands pass through unbuffered (see
    :func:`_passes_through`): the flat pipeline over the others, with the body given
    every operand in its place."""
    specs = in_specs + out_specs
    through = [_passes_through(s, k) for k, s in enumerate(specs)]
    keep = [k for k, t in enumerate(through) if not t]
    n_in = len(in_specs)

    def pipeline(*refs, allocations=None, **call_kw):
        if len(refs) != len(specs):
            raise ValueError(f"the pipeline takes {n_in} input and {len(out_specs)} output "
                             f"refs; got {len(refs)} refs")

        def inner_body(*blocks):
            it = iter(blocks)
            return body(*[refs[k] if through[k] else next(it) for k in range(len(refs))])

        inner = emit_pipeline(inner_body, in_specs=[specs[k] for k in keep if k < n_in],
                              out_specs=[specs[k] for k in keep if k >= n_in], **kw)
        if allocations is not None:
            allocations = [list(allocations)[k] for k in keep]
        return inner(*[refs[k] for k in keep], allocations=allocations, **call_kw)

    return pipeline


def _pytree_pipeline(body, in_specs: list, out_specs: list, **kw):
    """``emit_pipeline`` over pytrees of specs (and of refs), on the flat pipeline."""
    in_flat, in_tree = jax.tree_util.tree_flatten(in_specs, is_leaf=_is_spec)
    out_flat, out_tree = jax.tree_util.tree_flatten(out_specs, is_leaf=_is_spec)

    def flat_body(*blocks):
        ins = jax.tree_util.tree_unflatten(in_tree, blocks[:len(in_flat)])
        outs = jax.tree_util.tree_unflatten(out_tree, blocks[len(in_flat):])
        return body(*ins, *outs)

    inner = emit_pipeline(flat_body, in_specs=in_flat, out_specs=out_flat, **kw)

    def pipeline(*refs, **call_kw):
        if len(refs) != len(in_specs) + len(out_specs):
            raise ValueError(f"the pipeline takes {len(in_specs)} input and "
                             f"{len(out_specs)} output operands; got {len(refs)}")
        ins = in_tree.flatten_up_to(list(refs[:len(in_specs)]))
        outs = out_tree.flatten_up_to(list(refs[len(in_specs):]))
        return inner(*ins, *outs, **call_kw)

    return pipeline


def _partition_grid(grid, cores, semantics):
    """(this core's grid, the offsets of its indices): with ``cores`` (a grid axis index
    or mesh axis name(s)) naming more than one core, the first parallel dimension whose
    size they divide is split between them, as upstream's megacore pipelines."""
    if cores is None:
        return grid, (0,) * len(grid)
    if isinstance(cores, int):
        num, core = pl.num_programs(cores), pl.program_id(cores)
    else:
        num, core = lax.axis_size(cores), lax.axis_index(cores)
    if not isinstance(num, int):
        raise NotImplementedError(f"emit_pipeline: cannot partition the grid over a dynamic "
                                  f"number of cores (core_axis={cores!r})")
    if num == 1:
        return grid, (0,) * len(grid)
    semantics = tuple(canonical_semantics(d) for d in (
        semantics or (GridDimensionSemantics.ARBITRARY,) * len(grid)))
    if len(semantics) != len(grid):
        raise ValueError("dimension_semantics must be the same length as grid.")
    for i, (g, d) in enumerate(zip(grid, semantics)):
        if d == GridDimensionSemantics.PARALLEL and isinstance(g, int) and g % num == 0:
            local = g // num
            return (grid[:i] + (local,) + grid[i + 1:],
                    tuple(core * local if j == i else 0 for j in range(len(grid))))
    raise NotImplementedError(
        f"emit_pipeline: splitting grid {grid} over {num} cores needs a parallel grid "
        f"dimension whose size they divide (dimension_semantics={semantics}); other "
        f"splits are not implemented yet in pallas-tpu (backend 'mosaic_tpu')")


def _grid_size(g):
    """A static size as an int; a traced one (a dynamic grid) as an int32 scalar."""
    if isinstance(g, jax.core.Tracer):
        aval = jax.typeof(g)
        if aval.shape != () or not jnp.issubdtype(aval.dtype, jnp.integer):
            raise TypeError(f"emit_pipeline grid sizes must be integers; got a traced "
                            f"{aval.str_short()}")
        return g.astype(jnp.int32)
    return int(g)


def _traced_prod(grid):
    n = jnp.int32(1)
    for g in grid:
        n = n * g
    return n


def emit_pipeline_with_allocations(body, *, grid: Sequence[int], in_specs=(), out_specs=(),
                                   should_accumulate_out=False):
    """Returns ``(pipeline, make_allocations)``.

    ``make_allocations(*refs)`` gives one :class:`BufferedRef` per operand (allocation
    types); pass them through ``pl.run_scoped`` at the top of the kernel and call
    ``pipeline(*refs, allocations=allocs)`` as many times as needed, reusing the buffers.
    """
    pipeline = emit_pipeline(body, grid=grid, in_specs=in_specs, out_specs=out_specs,
                             should_accumulate_out=should_accumulate_out)

    def make_allocations(*refs):
        return make_pipeline_allocations(*refs, in_specs=in_specs, out_specs=out_specs)

    return pipeline, make_allocations
