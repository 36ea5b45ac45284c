"""The warp-specialised pipeline, ``emit_pipeline_warp_specialized``.

One *memory* warpgroup issues the TMA copies of the input blocks into a ring of SMEM
slots; the ``num_compute_wgs`` compute warpgroups wait for a slot's ``full`` barrier, run
the body on it and arrive on its ``consumed`` barrier, which the memory warpgroup waits
for before it refills the slot. An input with ``delay_release=d`` is released ``d`` steps
late (after step ``s + d``, since the body may still read step ``s``'s slot, e.g. with
an unwaited wgmma). Pipelines chained with ``pipeline_state`` share their allocations
and refill slots across their boundaries. The memory warpgroup lowers its registers to
``memory_registers`` and the compute warpgroups raise theirs (``setmaxnreg``), as
upstream.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallas as pl
from pallas_mosaic_gpu._src.loops import _unravel, rolled_fori_loop
from pallas_mosaic_gpu._src.memory import GMEM, Barrier
from pallas_mosaic_gpu._src.pipeline import (
    PipelinePipeline,
    _block_view,
    _check_grid,
    _in_smem,
    _index_invariant,
    _slot_type,
    _static,
    _store_blocks,
    fori_with_refs,
)
from pallas_mosaic_gpu._src.primitives.barriers import barrier_arrive, barrier_wait
from pallas_mosaic_gpu._src.primitives.copies import (
    copy_gmem_to_smem,
    wait_smem_to_gmem,
)
from pallas_mosaic_gpu._src.primitives.hints import set_max_registers

# setmaxnreg's operand: a per-thread register count, a multiple of 8 in [24, 256] (PTX).
MIN_REGISTERS, MAX_REGISTERS = 24, 256


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
    memory_registers: int
    compute_registers: int
    delay_release: int
    manual_consumed_barriers: bool
    pipeline_state: Any = None

    def _invariant(self) -> list[bool]:
        return [_index_invariant(s, self.grid) for s in self.out_specs]

    def get_allocations(self, *gmem_refs) -> dict:
        """The buffer types the pipeline needs, to allocate with ``pl.run_scoped``
        (``collective_axes`` = the warpgroup axis) and pass back as ``allocations``."""
        n_in = len(self.in_specs)
        outs = [_slot_type(s, r, 1 if inv else self.slots) for s, r, inv in
                zip(self.out_specs, gmem_refs[n_in:], self._invariant())]
        # One consumed barrier per slot for all inputs, or one per input when the body
        # arrives on them itself (manual_consumed_barriers).
        n_consumed = n_in if self.manual_consumed_barriers else 1
        return dict(
            smem=[_slot_type(s, r, self.slots) for s, r in zip(self.in_specs, gmem_refs)],
            out_smem=outs,
            full=Barrier(num_arrivals=n_in, num_barriers=self.slots),
            consumed=[Barrier(num_arrivals=self.num_compute_wgs, num_barriers=self.slots)
                      for _ in range(n_consumed)],
        )

    def __call__(self, *gmem_refs, allocations: Any = None):
        n = len(self.in_specs) + len(self.out_specs)
        if len(gmem_refs) != n:
            raise ValueError(f"the pipeline has {n} BlockSpecs but got {len(gmem_refs)} refs")
        if allocations is None:
            if self.pipeline_state is not None:
                raise ValueError("Pipeline state should not be set when using automatic "
                                 "allocation (pass allocations= from get_allocations)")
            return pl.run_scoped(lambda allocs: self._run(gmem_refs, allocs),
                                 self.get_allocations(*gmem_refs),
                                 collective_axes=self.wg_axis)
        return self._run(gmem_refs, allocations)

    def _run(self, gmem_refs, allocs):
        smem, full, consumed = allocs["smem"], allocs["full"], allocs["consumed"]
        consumed = list(consumed) if isinstance(consumed, (list, tuple)) else [consumed]
        out_smem = allocs.get("out_smem", [])
        n_in = len(self.in_specs)
        wg = lax.axis_index(self.wg_axis)

        @pl.when(wg == self.memory_thread_idx)
        def _memory():
            # The memory warpgroup only issues copies: it gives registers back so that
            # the compute warpgroups can take them.
            set_max_registers(self.memory_registers, action="decrease")
            self._memory(gmem_refs[:n_in], smem, full, consumed)

        @pl.when(wg != self.memory_thread_idx)
        def _compute():
            set_max_registers(self.compute_registers, action="increase")
            self._compute(gmem_refs, smem, out_smem, full, consumed)

    def _memory(self, in_refs, smem, full, consumed):
        slots, d = self.slots, self.delay_release
        num_steps = math.prod(self.grid)
        manual = self.manual_consumed_barriers
        # In a chain of pipelines sharing allocations (pipeline_state), only the first
        # (START) finds its slots free; the others first wait for the previous
        # pipeline's last uses, and only the last (STOP) drains.
        state = self.pipeline_state
        start = True if state is None else state == PipelinePipeline.START
        stop = True if state is None else state == PipelinePipeline.STOP

        def step(i, carry):
            slot = lax.rem(i, jnp.int32(slots))
            indices = _unravel(i, self.grid)
            refill = i >= slots if start is True else (
                True if start is False else (i >= slots) | jnp.logical_not(start))
            for k, (spec, ref, buf) in enumerate(zip(self.in_specs, in_refs, smem)):
                if k == 0 or manual:
                    # Step i refills the slot of step i - slots, once that is released.
                    wait = functools.partial(barrier_wait,
                                             consumed[k if manual else 0].at[slot])
                    wait() if refill is True else pl.when(refill)(wait)
                copy_gmem_to_smem(_block_view(spec, ref, indices), buf.at[slot],
                                  full.at[slot])
            return carry

        rolled_fori_loop(jnp.int32(0), jnp.int32(num_steps), step, None)

        # Drain: the releases of the last steps (all but the last ``delay_release``,
        # which are never released) must be awaited before the slots are reused (by a
        # later pipeline) or freed.
        def drain(j, carry=None):
            for b in consumed:
                barrier_wait(b.at[lax.rem(jnp.asarray(j, jnp.int32), jnp.int32(slots))])
            return carry

        if stop is not True:
            if stop is not False:
                pl.when(stop)(lambda: [drain(j) for j in range(num_steps - slots, num_steps)])
        elif _static(self.grid):
            for j in range(max(num_steps - slots, 0), num_steps - d):
                drain(j)
        else:
            lo = jnp.maximum(jnp.int32(num_steps) - slots, 0)
            lax.fori_loop(lo, jnp.int32(num_steps) - d, drain, None)

    def _compute(self, gmem_refs, smem, out_smem, full, consumed):
        slots, d = self.slots, self.delay_release
        num_steps = math.prod(self.grid)
        n_in = len(self.in_specs)
        invariant = self._invariant()
        outs = list(zip(self.out_specs, gmem_refs[n_in:], out_smem))
        per_step = [o for o, inv in zip(outs, invariant) if not inv]
        at_end = [o for o, inv in zip(outs, invariant) if inv]

        def step(i, carry):
            slot = lax.rem(i, jnp.int32(slots))
            # Step i releases the slot of step i - delay_release (kept non-negative).
            released = lax.rem(i + jnp.int32(slots - d % slots), jnp.int32(slots))
            barrier_wait(full.at[slot])
            indices = _unravel(i, self.grid)
            if per_step:
                # The slot's previous output copy must have read its SMEM.
                wait_smem_to_gmem(slots - 1, wait_read_only=True)
            refs = [buf.at[slot] for buf in smem]
            refs += [buf.at[0] if inv else buf.at[slot]
                     for buf, inv in zip(out_smem, invariant)]
            if self.manual_consumed_barriers:
                refs += [b.at[released] for b in consumed]
            if self.compute_context is None:
                self.body(indices, *refs)
                new = carry
            else:
                new = self.body(indices, *refs, carry)
            if not self.manual_consumed_barriers:
                arrive = functools.partial(barrier_arrive, consumed[0].at[released])
                if d:
                    pl.when(i >= d)(arrive)
                else:
                    arrive()
            if per_step:
                _store_blocks(per_step, slot, indices)
            return new

        def eval_pipeline(carry):
            if calls:
                raise ValueError("Cannot call pipeline more than once in `compute_context`")
            calls.append(True)
            out = fori_with_refs(num_steps, step, carry)
            if at_end:
                _store_blocks(at_end, 0, _unravel(jnp.int32(num_steps - 1), self.grid))
            if outs:
                wait_smem_to_gmem(0)
            return out

        calls: list[bool] = []
        if self.compute_context is None:
            eval_pipeline(None)
        else:
            self.compute_context(eval_pipeline)
            if not calls:
                raise ValueError("Pipeline was not called in `compute_context`")


def emit_pipeline_warp_specialized(
        body: Callable[..., None], *, grid: Sequence[int], memory_registers: int,
        in_specs: Any = (), out_specs: Any = (), max_concurrent_steps: int = 2,
        wg_axis: str, num_compute_wgs: int, pipeline_state: Any = None,
        manual_consumed_barriers: bool = False, compute_context: Any = None,
        memory_thread_idx: int | None = None) -> _WarpSpecializedPipeline:
    """A pipeline whose copies are issued by one memory warpgroup while
    ``num_compute_wgs`` warpgroups (along ``wg_axis``) run ``body``; with
    ``compute_context``, the body takes and returns a carry and
    ``compute_context(eval_pipeline)`` runs on the compute warpgroups only. With
    ``manual_consumed_barriers`` the body gets one consumed barrier per input (after
    the output refs) and must arrive on each at every step. ``pipeline_state``
    (``PipelinePipeline.START``/``STEADY``/``STOP``, maybe traced) chains pipelines that
    share ``allocations`` without draining the slots between them.
    The memory warpgroup lowers its registers to ``memory_registers`` per thread and the
    compute warpgroups raise theirs to a share of the rest (``setmaxnreg``)."""
    grid = _check_grid(grid)
    if num_compute_wgs < 1:
        raise ValueError(f"num_compute_wgs must be >= 1, got {num_compute_wgs}")
    _check_registers("memory_registers", memory_registers)
    compute_registers = _compute_registers(memory_registers, num_compute_wgs)
    out_specs = tuple(jax.tree_util.tree_leaves(
        out_specs, is_leaf=lambda s: isinstance(s, pl.BlockSpec)))
    if out_specs and num_compute_wgs > 1:
        raise NotImplementedError(
            "SMEM outputs are not supported with multiple compute warpgroups")
    in_specs = tuple(jax.tree_util.tree_leaves(
        in_specs, is_leaf=lambda s: isinstance(s, pl.BlockSpec)))
    for s in in_specs:
        if not _in_smem(s) or getattr(s, "memory_space", None) is GMEM:
            raise ValueError("emit_pipeline_warp_specialized: in_specs must be in SMEM")
    delays = {int(getattr(s, "delay_release", 0)) for s in in_specs}
    if len(delays) > 1:
        raise NotImplementedError(
            "emit_pipeline_warp_specialized: all inputs must have the same delay_release "
            f"(one consumed barrier per slot releases them together), got "
            f"{[getattr(s, 'delay_release', 0) for s in in_specs]}")
    delay = max(delays or {0})
    if max_concurrent_steps <= delay:
        raise ValueError("max_concurrent_steps must be greater than delay_release, but "
                         f"max_concurrent_steps={max_concurrent_steps}, "
                         f"delay_release={delay}")
    # A traced grid (a step count read in the kernel) keeps max_concurrent_steps slots.
    slots = max(1, min(max_concurrent_steps, math.prod(grid))) if _static(grid) \
        else max_concurrent_steps
    if pipeline_state is not None:
        if not _static(grid):
            raise NotImplementedError(
                "A pipeline of pipelines is not supported with dynamic grids")
        if math.prod(grid) % slots:
            raise NotImplementedError(
                "A pipeline of pipelines is only allowed when the number of steps (product "
                f"of grid, here {math.prod(grid)}) is divisible by "
                f"max_concurrent_steps={slots}")
        if delay:
            raise NotImplementedError(
                "A pipeline of pipelines is not supported with delay_release")
    mem = num_compute_wgs if memory_thread_idx is None else memory_thread_idx
    return _WarpSpecializedPipeline(body, grid, in_specs, out_specs, slots, wg_axis,
                                    num_compute_wgs, compute_context, mem,
                                    int(memory_registers), compute_registers, delay,
                                    bool(manual_consumed_barriers), pipeline_state)


def _check_registers(name: str, n: Any) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n % 8 or not (
            MIN_REGISTERS <= n <= MAX_REGISTERS):
        raise ValueError(
            f"emit_pipeline_warp_specialized({name}={n!r}): the per-thread register count "
            f"setmaxnreg sets must be an int, a multiple of 8 in [{MIN_REGISTERS}, "
            f"{MAX_REGISTERS}] (40 is usual for the memory warpgroup on H100)")


def _compute_registers(memory_registers: int, num_compute_wgs: int) -> int:
    """Registers per thread of each compute warpgroup, as upstream: a warpgroup of 128
    threads could hold the whole 64K register file (512 each); the memory warpgroup keeps
    ``memory_registers``, the compute warpgroups share the rest, at most 256, rounded
    down to a multiple of 8."""
    n = min(MAX_REGISTERS, (512 - int(memory_registers)) // num_compute_wgs) // 8 * 8
    if n < MIN_REGISTERS:
        raise ValueError(
            f"emit_pipeline_warp_specialized(memory_registers={memory_registers}, "
            f"num_compute_wgs={num_compute_wgs}): each compute warpgroup would get {n} "
            f"registers per thread, below setmaxnreg's minimum {MIN_REGISTERS}; use fewer "
            "compute warpgroups or fewer memory_registers")
    return n
