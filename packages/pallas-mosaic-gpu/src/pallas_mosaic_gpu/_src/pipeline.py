"""Software pipelines inside a kernel: ``emit_pipeline`` and
``emit_pipeline_warp_specialized``.

Both step over a ``grid``; at each step the body gets SMEM copies of the input blocks
(chosen by the BlockSpecs' index maps) and SMEM blocks for the outputs. Inputs are
fetched ``max_concurrent_steps`` steps ahead into a ring of SMEM slots with TMA copies
and barriers; outputs are stored back with TMA after each step. They are built from the
public primitives (``copy_gmem_to_smem``, ``barrier_wait``, ...), so every interpreter
and the lowering give them the same meaning.

In the warp-specialised form one *memory* warpgroup issues the copies and the
``num_compute_wgs`` compute warpgroups run the body; a ``consumed`` barrier per slot
tells the memory warpgroup when all compute warpgroups are done with a slot.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas as pl
from pallas_mosaic_gpu._src.loops import _unravel
from pallas_mosaic_gpu._src.memory import GMEM, SMEM, Barrier
from pallas_mosaic_gpu._src.primitives.barriers import barrier_arrive, barrier_wait
from pallas_mosaic_gpu._src.primitives.copies import (
    commit_smem,
    commit_smem_to_gmem_group,
    copy_gmem_to_smem,
    copy_smem_to_gmem,
    wait_smem_to_gmem,
)


class PipelinePipeline(enum.IntEnum):
    """Where a pipeline stands in a chain of pipelines sharing allocations."""

    START = 0
    STEADY = 1
    STOP = 2


def _dims(spec, shape):
    """Per array dim: block size, or None for a squeezed dim."""
    if spec.block_shape is None:
        return list(shape)
    out = []
    for d in spec.block_shape:
        if d is None or type(d).__name__ == "Squeezed":
            out.append(None)
        elif hasattr(d, "block_size"):
            out.append(int(d.block_size))
        else:
            out.append(int(d))
    return out


def _in_smem(spec) -> bool:
    return getattr(spec, "memory_space", None) in (None, SMEM)


def _block_view(spec, ref, indices):
    dims = _dims(spec, ref.shape)
    idx = spec.index_map(*indices) if spec.index_map is not None else (0,) * len(dims)
    idx = idx if isinstance(idx, tuple) else (idx,)
    if len(idx) != len(dims):
        raise ValueError(f"index_map returned {len(idx)} indices for a block of {len(dims)} "
                         "dims")
    at = tuple(i if d is None else pl.ds(jnp.asarray(i, jnp.int32) * d, d)
               for i, d in zip(idx, dims))
    return ref.at[at]


def _slot_type(spec, ref, slots):
    shape = [d for d in _dims(spec, ref.shape) if d is not None]
    return SMEM((slots, *shape), ref.dtype, transforms=tuple(getattr(spec, "transforms", ())))


def _is_ref(x) -> bool:
    try:
        return hasattr(jax.typeof(x), "inner_aval")
    except TypeError:
        return False


def fori_with_refs(n: int, body: Callable[[Any, Any], Any], carry: Any) -> Any:
    """``lax.fori_loop(0, n, body, carry)`` where ``carry`` may hold refs: they are
    closed over (a loop cannot carry a ref) and handed back unchanged."""
    leaves, tree = jax.tree_util.tree_flatten(carry)
    is_ref = [_is_ref(x) for x in leaves]

    def merge(values):
        it = iter(values)
        return tree.unflatten([x if r else next(it) for x, r in zip(leaves, is_ref)])

    def step(i, values):
        out = jax.tree_util.tree_leaves(body(i, merge(values)))
        return [x for x, r in zip(out, is_ref) if not r]

    values = lax.fori_loop(jnp.int32(0), jnp.int32(n), step,
                           [x for x, r in zip(leaves, is_ref) if not r])
    return merge(values)


def _static(grid) -> bool:
    """Whether every grid dim is a Python/numpy int (not a traced value)."""
    return all(isinstance(g, (int, np.integer)) for g in grid)


def _index_invariant(spec, grid) -> bool:
    """True if ``spec``'s index map gives the same block at every step of ``grid``."""
    if spec.index_map is None:
        return True
    if not _static(grid):  # a traced grid: assume the block moves
        return False
    points = list(itertools.product(*(range(int(g)) for g in grid)))
    if len(points) > 4096:
        return False
    try:
        with jax.ensure_compile_time_eval():
            blocks = {tuple(int(i) for i in jax.tree_util.tree_leaves(
                spec.index_map(*[jnp.int32(i) for i in p]))) for p in points}
    except jax.errors.ConcretizationTypeError:  # depends on traced values
        return False
    return len(blocks) == 1


def _check_grid(grid):
    if any(isinstance(g, int) and g <= 0 for g in grid):
        raise ValueError(
            f"All elements in the grid must be strictly positive, but got grid={tuple(grid)}")
    return tuple(grid)


def emit_pipeline(body: Callable[..., Any], *, grid: Sequence[int],
                  in_specs: Sequence[Any] = (), out_specs: Sequence[Any] = (),
                  max_concurrent_steps: int = 1, init_carry: Any = None):
    """A function of the GMEM refs that runs ``body(indices, *in_smem, *out_smem)``
    (``..., carry) -> carry`` with ``init_carry``) at every step of ``grid``."""
    grid = _check_grid(grid)
    in_specs, out_specs = tuple(in_specs), tuple(out_specs)
    for s in in_specs:
        if getattr(s, "collective_axes", ()):
            raise NotImplementedError(
                "BlockSpecs with collective_axes are not supported in emit_pipeline")
    for s in out_specs:
        if getattr(s, "collective_axes", ()):
            raise ValueError("Output BlockSpecs cannot have collective_axes")
    delays = sorted({getattr(s, "delay_release", 0) for s in in_specs} or {0})
    if max_concurrent_steps <= delays[0]:
        raise ValueError("max_concurrent_steps must be greater than all delay_release values,"
                         f" but max_concurrent_steps={max_concurrent_steps} and "
                         f"delay_release_levels={delays}.")
    # A grid dim may be a traced value (a per-group step count read in the kernel); the
    # ring then has max_concurrent_steps slots and fetches only steps that exist.
    num_steps = math.prod(grid)
    static = _static(grid)
    slots = max(1, min(max_concurrent_steps, num_steps)) if static else max_concurrent_steps
    specs = (*in_specs, *out_specs)

    def pipeline(*gmem_refs):
        if len(gmem_refs) != len(specs):
            raise ValueError(f"the pipeline has {len(specs)} BlockSpecs but got "
                             f"{len(gmem_refs)} refs")
        n_in = len(in_specs)
        # An output whose block is the same at every step (an accumulator) keeps one
        # SMEM buffer across the steps and is stored once, at the end.
        invariant = [k >= n_in and _index_invariant(s, grid) for k, s in enumerate(specs)]
        types = [_slot_type(s, r, 1 if inv else slots) if _in_smem(s) else None
                 for s, r, inv in zip(specs, gmem_refs, invariant)]
        n_fetched = sum(1 for s in in_specs if _in_smem(s))
        barrier = Barrier(num_arrivals=n_fetched, num_barriers=slots) if n_fetched else None
        return pl.run_scoped(lambda bufs, bar: _run(gmem_refs, bufs, bar, invariant),
                             types, barrier)

    def _run(gmem_refs, bufs, barrier, invariant):
        n_in = len(in_specs)

        def fetch(step, delay=None):
            """Fetches step ``step``'s input blocks (those released ``delay`` steps
            late, or all) into its slot."""
            slot = lax.rem(step, jnp.int32(slots))
            indices = _unravel(step, grid)
            for spec, ref, buf in zip(in_specs, gmem_refs[:n_in], bufs[:n_in]):
                if buf is not None and (delay is None or
                                        getattr(spec, "delay_release", 0) == delay):
                    copy_gmem_to_smem(_block_view(spec, ref, indices), buf.at[slot],
                                      barrier.at[slot])

        def store(outs, slot, indices):
            commit_smem()
            for spec, ref, buf in outs:
                copy_smem_to_gmem(buf.at[slot], _block_view(spec, ref, indices),
                                  commit_group=False)
            commit_smem_to_gmem_group()

        per_step = [(s, r, b) for k, (s, r, b) in enumerate(zip(specs, gmem_refs, bufs))
                    if k >= n_in and b is not None and not invariant[k]]
        at_end = [(s, r, b) for k, (s, r, b) in enumerate(zip(specs, gmem_refs, bufs))
                  if k >= n_in and b is not None and invariant[k]]

        for s in range(slots):
            if static:
                fetch(jnp.int32(s))
            else:
                pl.when(s < num_steps)(functools.partial(fetch, jnp.int32(s)))

        def step_fn(step, carry):
            slot = lax.rem(step, jnp.int32(slots))
            indices = _unravel(step, grid)
            if barrier is not None:
                barrier_wait(barrier.at[slot])
            refs = [(buf.at[0] if invariant[k] else buf.at[slot]) if buf is not None
                    else _block_view(spec, ref, indices)
                    for k, (spec, ref, buf) in enumerate(zip(specs, gmem_refs, bufs))]
            if per_step:
                # The slot's previous output copy must have read its SMEM.
                wait_smem_to_gmem(slots - 1, wait_read_only=True)
            if init_carry is None:
                body(indices, *refs)
                new_carry = carry
            else:
                new_carry = body(indices, *refs, carry)
            if per_step:
                store(per_step, slot, indices)

            # A slot is refilled once released: an input with delay_release=d keeps
            # step s's block until step s + d has run (the body may still be reading
            # it, e.g. an unwaited wgmma), so after step s the slot of step s - d
            # receives step s - d + slots, as upstream.
            for d in delays:
                pl.when((step >= d) & (step + slots - d < num_steps))(
                    functools.partial(fetch, step + slots - d, d))

            return new_carry

        out = fori_with_refs(num_steps, step_fn, init_carry)
        if at_end:
            store(at_end, 0, _unravel(jnp.int32(num_steps - 1), grid))
        if per_step or at_end:
            wait_smem_to_gmem(0)
        return out

    return pipeline


@dataclasses.dataclass
class _WarpSpecializedPipeline:
    """The function ``emit_pipeline_warp_specialized`` returns: call it with the GMEM
    refs (and, optionally, ``allocations=`` from :meth:`get_allocations`)."""

    body: Callable[..., Any]
    grid: tuple
    in_specs: tuple
    out_specs: tuple
    slots: int
    wg_axis: str
    num_compute_wgs: int
    compute_context: Any
    memory_thread_idx: int

    def _invariant(self) -> list[bool]:
        return [_index_invariant(s, self.grid) for s in self.out_specs]

    def get_allocations(self, *gmem_refs) -> dict:
        """The buffer types the pipeline needs, to allocate with ``pl.run_scoped``
        (``collective_axes`` = the warpgroup axis) and pass back as ``allocations``."""
        n_in = len(self.in_specs)
        outs = [_slot_type(s, r, 1 if inv else self.slots) for s, r, inv in
                zip(self.out_specs, gmem_refs[n_in:], self._invariant())]
        return dict(
            smem=[_slot_type(s, r, self.slots) for s, r in zip(self.in_specs, gmem_refs)],
            out_smem=outs,
            full=Barrier(num_arrivals=len(self.in_specs), num_barriers=self.slots),
            consumed=Barrier(num_arrivals=self.num_compute_wgs, num_barriers=self.slots),
        )

    def __call__(self, *gmem_refs, allocations: Any = None):
        n = len(self.in_specs) + len(self.out_specs)
        if len(gmem_refs) != n:
            raise ValueError(f"the pipeline has {n} BlockSpecs but got {len(gmem_refs)} refs")
        if allocations is None:
            return pl.run_scoped(lambda allocs: self._run(gmem_refs, allocs),
                                 self.get_allocations(*gmem_refs),
                                 collective_axes=self.wg_axis)
        return self._run(gmem_refs, allocations)

    def _run(self, gmem_refs, allocs):
        smem, full, consumed = allocs["smem"], allocs["full"], allocs["consumed"]
        out_smem = allocs.get("out_smem", [])
        slots, num_steps = self.slots, math.prod(self.grid)
        n_in = len(self.in_specs)
        in_refs, out_refs = gmem_refs[:n_in], gmem_refs[n_in:]
        invariant = self._invariant()
        wg = lax.axis_index(self.wg_axis)

        @pl.when(wg == self.memory_thread_idx)
        def _memory():
            def step(i, _):
                slot = lax.rem(i, jnp.int32(slots))

                @pl.when(i >= slots)
                def _():
                    barrier_wait(consumed.at[slot])

                indices = _unravel(i, self.grid)
                for spec, ref, buf in zip(self.in_specs, in_refs, smem):
                    copy_gmem_to_smem(_block_view(spec, ref, indices), buf.at[slot],
                                      full.at[slot])
                return _

            lax.fori_loop(jnp.int32(0), jnp.int32(num_steps), step, None)
            # Drain: the last use of every slot must be consumed before the slots are
            # reused (by a later pipeline) or freed.
            for k in range(min(slots, num_steps)):
                barrier_wait(consumed.at[(num_steps - 1 - k) % slots])

        def store(outs, slot, indices):
            commit_smem()
            for spec, ref, buf in outs:
                copy_smem_to_gmem(buf.at[slot], _block_view(spec, ref, indices),
                                  commit_group=False)
            commit_smem_to_gmem_group()

        outs = list(zip(self.out_specs, out_refs, out_smem))
        per_step = [o for o, inv in zip(outs, invariant) if not inv]
        at_end = [o for o, inv in zip(outs, invariant) if inv]

        def eval_pipeline(carry):
            def step(i, carry):
                slot = lax.rem(i, jnp.int32(slots))
                barrier_wait(full.at[slot])
                indices = _unravel(i, self.grid)
                if per_step:
                    # The slot's previous output copy must have read its SMEM.
                    wait_smem_to_gmem(slots - 1, wait_read_only=True)
                refs = [buf.at[slot] for buf in smem]
                refs += [buf.at[0] if inv else buf.at[slot]
                         for buf, inv in zip(out_smem, invariant)]
                if self.compute_context is None:
                    self.body(indices, *refs)
                    new = carry
                else:
                    new = self.body(indices, *refs, carry)
                barrier_arrive(consumed.at[slot])
                if per_step:
                    store(per_step, slot, indices)
                return new

            out = fori_with_refs(num_steps, step, carry)
            if at_end:
                store(at_end, 0, _unravel(jnp.int32(num_steps - 1), self.grid))
            if outs:
                wait_smem_to_gmem(0)
            return out

        @pl.when(wg != self.memory_thread_idx)
        def _compute():
            if self.compute_context is None:
                eval_pipeline(None)
            else:
                self.compute_context(eval_pipeline)


def emit_pipeline_warp_specialized(
        body: Callable[..., None], *, grid: Sequence[int], memory_registers: int,
        in_specs: Any = (), out_specs: Any = (), max_concurrent_steps: int = 2,
        wg_axis: str, num_compute_wgs: int, pipeline_state: Any = None,
        manual_consumed_barriers: bool = False, compute_context: Any = None,
        memory_thread_idx: int | None = None) -> _WarpSpecializedPipeline:
    """A pipeline whose copies are issued by one memory warpgroup while
    ``num_compute_wgs`` warpgroups (along ``wg_axis``) run ``body``; with
    ``compute_context``, the body takes and returns a carry and
    ``compute_context(eval_pipeline)`` runs on the compute warpgroups only.
    ``memory_registers`` is a register-allocation hint (no effect on semantics)."""
    del memory_registers
    grid = _check_grid(grid)
    out_specs = tuple(jax.tree_util.tree_leaves(
        out_specs, is_leaf=lambda s: isinstance(s, pl.BlockSpec)))
    if out_specs and num_compute_wgs > 1:
        raise NotImplementedError(
            "SMEM outputs are not supported with multiple compute warpgroups")
    if manual_consumed_barriers:
        raise NotImplementedError("emit_pipeline_warp_specialized(manual_consumed_barriers="
                                  "True) is not supported by pallas-mosaic-gpu yet")
    if pipeline_state is not None:
        raise NotImplementedError("emit_pipeline_warp_specialized(pipeline_state=...) is not "
                                  "supported by pallas-mosaic-gpu yet")
    in_specs = tuple(jax.tree_util.tree_leaves(
        in_specs, is_leaf=lambda s: isinstance(s, pl.BlockSpec)))
    for s in in_specs:
        if not _in_smem(s) or getattr(s, "memory_space", None) is GMEM:
            raise ValueError("emit_pipeline_warp_specialized: in_specs must be in SMEM")
    if num_compute_wgs < 1:
        raise ValueError(f"num_compute_wgs must be >= 1, got {num_compute_wgs}")
    slots = max(1, min(max_concurrent_steps, math.prod(grid)))
    mem = num_compute_wgs if memory_thread_idx is None else memory_thread_idx
    return _WarpSpecializedPipeline(body, grid, in_specs, out_specs, slots, wg_axis,
                                    num_compute_wgs, compute_context, mem)
