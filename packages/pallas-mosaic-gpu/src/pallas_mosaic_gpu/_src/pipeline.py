"""Software pipelines inside a kernel: ``emit_pipeline`` (the warp-specialised form,
``emit_pipeline_warp_specialized``, is in ``pipeline_ws`` and shares these helpers).

A pipeline steps over a ``grid``; at each step the body gets SMEM copies of the input
blocks (chosen by the BlockSpecs' index maps) and SMEM blocks for the outputs. Inputs are
fetched ``max_concurrent_steps`` steps ahead into a ring of SMEM slots with TMA copies
and barriers; outputs are stored back with TMA after each step. They are built from the
public primitives (``copy_gmem_to_smem``, ``barrier_wait``, ...), so every interpreter
and the lowering give them the same meaning.
"""

from __future__ import annotations

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
from pallas_mosaic_gpu._src.loops import _unravel, rolled_fori_loop
from pallas_mosaic_gpu._src.memory import SMEM, Barrier
from pallas_mosaic_gpu._src.primitives.barriers import barrier_wait
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


def _store_blocks(outs, slot, indices):
    """Copies each ``(spec, gmem ref, SMEM slots)`` of ``outs``' slot ``slot`` to its
    block at ``indices``, as one bulk group after the SMEM writes are committed."""
    commit_smem()
    for spec, ref, buf in outs:
        copy_smem_to_gmem(buf.at[slot], _block_view(spec, ref, indices), commit_group=False)
    commit_smem_to_gmem_group()


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
    closed over (a loop cannot carry a ref) and handed back unchanged. A pipeline's step
    loop: kept rolled (``rolled_fori_loop``)."""
    leaves, tree = jax.tree_util.tree_flatten(carry)
    is_ref = [_is_ref(x) for x in leaves]

    def merge(values):
        it = iter(values)
        return tree.unflatten([x if r else next(it) for x, r in zip(leaves, is_ref)])

    def step(i, values):
        out = jax.tree_util.tree_leaves(body(i, merge(values)))
        return [x for x, r in zip(out, is_ref) if not r]

    values = rolled_fori_loop(jnp.int32(0), jnp.int32(n), step,
                              [x for x, r in zip(leaves, is_ref) if not r])
    return merge(values)


def _ring_slot(step, slots: int):
    """The slot of ``step`` (>= 0) in a ring of ``slots``: a mask when ``slots`` is a
    power of two (a signed remainder costs a few instructions more)."""
    if slots & (slots - 1) == 0:
        return lax.bitwise_and(step, jnp.int32(slots - 1))
    return lax.rem(step, jnp.int32(slots))


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

        def fetch(step, slot, delay=None):
            """Fetches step ``step``'s input blocks (those released ``delay`` steps
            late, or all) into its slot ``slot``."""
            indices = _unravel(step, grid)
            for spec, ref, buf in zip(in_specs, gmem_refs[:n_in], bufs[:n_in]):
                if buf is not None and (delay is None or
                                        getattr(spec, "delay_release", 0) == delay):
                    copy_gmem_to_smem(_block_view(spec, ref, indices), buf.at[slot],
                                      barrier.at[slot])

        per_step = [(s, r, b) for k, (s, r, b) in enumerate(zip(specs, gmem_refs, bufs))
                    if k >= n_in and b is not None and not invariant[k]]
        at_end = [(s, r, b) for k, (s, r, b) in enumerate(zip(specs, gmem_refs, bufs))
                  if k >= n_in and b is not None and invariant[k]]

        if static:
            for s in range(slots):
                fetch(jnp.int32(s), jnp.int32(s))
        else:  # a loop to the traced min(slots, steps): one copy per input in the code
            lax.fori_loop(jnp.int32(0), jnp.minimum(jnp.int32(slots), num_steps),
                          lambda s, c: (fetch(s, s), c)[1], None)

        def step_fn(step, state):
            # The slot is carried (0, 1, ..., slots - 1, 0, ...), as upstream, not the
            # step's remainder: no division per step, and LLVM cannot tie the slot to
            # the step the body tests (``block_idx == 0`` made it keep slot 0's SMEM
            # addresses in registers through the loop).
            slot, carry = state
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
                _store_blocks(per_step, slot, indices)

            # A slot is refilled once released: an input with delay_release=d keeps
            # step s's block until step s + d has run (the body may still be reading
            # it, e.g. an unwaited wgmma), so after step s the slot of step s - d
            # receives step s - d + slots, as upstream.
            for d in delays:
                ahead = step + slots - d
                pl.when((step >= d) & (ahead < num_steps))(
                    functools.partial(fetch, ahead, _ring_slot(ahead, slots), d))

            if slots > 1:
                slot = jnp.where(slot == slots - 1, jnp.int32(0), slot + 1)
            return slot, new_carry

        _, out = fori_with_refs(num_steps, step_fn, (jnp.int32(0), init_carry))
        if at_end:
            _store_blocks(at_end, 0, _unravel(jnp.int32(num_steps - 1), grid))
        if per_step or at_end:
            wait_smem_to_gmem(0)
        return out

    return pipeline
