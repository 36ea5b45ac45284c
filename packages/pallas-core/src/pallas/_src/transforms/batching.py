"""The batching (``vmap``) rule of ``pallas_call_p``.

``vmap`` of a ``pallas_call`` is one ``pallas_call`` whose grid has a new **outermost**
axis of size ``B`` (the batch). Outermost, so that in the grid's lexicographic order all
iterations of one batch element run together, exactly as in the unbatched call: output
blocks revisited along the inner axes and scratch carried between iterations behave as
before, and ``program_id(0) == 0`` still marks the first iteration of an element.

- A batched operand (moved to batch dimension 0) gets a leading ``Squeezed()`` block dim
  whose index is the batch index: ``(b, *g, *pf) -> (b, *index_map(*g, *pf))``.
- An unbatched operand keeps its block mapping; its index map ignores ``b``. It is never
  copied per batch element.
- Dynamic grid sizes (the call's first operands) stay unbatched operands; a symbolic
  batch size (``jax.export`` shape polymorphism) makes the batch axis dynamic too.
- Every output is batched. An unbatched input aliased to an output is broadcast first.
- The kernel jaxpr is rewritten so ``program_id(i)``/``num_programs(i)`` refer to axis
  ``i + 1`` (see :mod:`pallas._src.transforms.grid_axes`); their values are unchanged.

Some cases run as a sequential ``lax.map`` of the unbatched call instead (correct, but
one call per batch element): batched dynamic grid sizes, batched scalar-prefetch operands (the index maps would
need batched prefetch refs), a scalar-prefetch operand aliased to an output, and calls
with interpreter checks on (their error vector is decoded against the unbatched
kernel).
"""

from __future__ import annotations

import dataclasses
import itertools

import jax.numpy as jnp
from jax import lax

from pallas._src import block_spec as bs
from pallas._src import jax_compat as jc
from pallas._src.grid_spec import BlockMapping, dynamic_grid_dim
from pallas._src.pallas_call import pallas_call_p
from pallas._src.transforms.grid_axes import shift_grid_axes_closed

_batch_axis_ids = itertools.count()


@dataclasses.dataclass(frozen=True)
class BatchAxisName:
    """The name of a grid axis added by ``vmap`` (unique, so nested vmaps never clash)."""

    id: int

    def __repr__(self) -> str:
        return f"vmap_batch_{self.id}"


def _move_to_front(x, d, size):
    if d is jc.not_mapped:
        return x
    return jnp.moveaxis(x, d, 0) if d != 0 else x


def _batched_index_map(bm: BlockMapping, n_grid: int, batched: bool):
    """The index map of ``bm`` over the grid with a leading batch axis."""
    old = shift_grid_axes_closed(bm.index_map_jaxpr, 1)
    old_avals = [v.aval for v in old.jaxpr.invars]
    avals = [jc.ShapedArray((), jnp.int32), *old_avals]

    def index_map(b, *rest):
        outs = jc.core.eval_jaxpr(old.jaxpr, old.consts, *rest)
        return [b, *outs] if batched else list(outs)

    jaxpr, _, consts = jc.trace_kernel_to_jaxpr(index_map, avals,
                                                f"batched index_map for {bm.origin}")
    return jc.ClosedJaxpr(jaxpr, consts)


def batch_block_mapping(bm: BlockMapping, size: int, n_grid: int, batched: bool
                        ) -> BlockMapping:
    """``bm`` for the batched call: a leading ``Squeezed`` batch dim if ``batched``."""
    index_map = _batched_index_map(bm, n_grid, batched)
    if not batched:
        return dataclasses.replace(bm, index_map_jaxpr=index_map)
    aval = bm.array_aval.update(shape=(size, *bm.array_aval.shape))
    return dataclasses.replace(
        bm,
        array_aval=aval,
        block_dims=(bs.Squeezed(), *bm.block_dims),
        index_map_jaxpr=index_map,
        whole=False,  # the kernel still sees the whole array of its batch element
    )


def _batched_compiler_params(cp):
    """Compiler params for the batched grid (one more, leading, parallel axis)."""
    if cp is None or isinstance(cp, dict):
        return cp
    hook = getattr(cp, "with_batch_grid_axis", None)
    if hook is not None:
        return hook()
    sem = getattr(cp, "dimension_semantics", None)
    if sem is not None and dataclasses.is_dataclass(cp):
        first = sem[0] if len(sem) else "parallel"
        par = "parallel" if isinstance(first, str) else type(first)("parallel")
        return dataclasses.replace(cp, dimension_semantics=(par, *sem))
    return cp


def _batched_cost(cost, size):
    """The cost of ``size`` calls (every field scales with the batch)."""
    if cost is None or not dataclasses.is_dataclass(cost):
        return cost
    return dataclasses.replace(cost, **{
        f.name: getattr(cost, f.name) * size for f in dataclasses.fields(cost)
        if isinstance(getattr(cost, f.name), int)})


def _loop_fallback(args, dims, size, params):
    """Runs the unbatched call once per batch element with ``lax.map``."""
    batched_idx = [i for i, d in enumerate(dims) if d is not jc.not_mapped]
    xs = [_move_to_front(args[i], dims[i], size) for i in batched_idx]

    def body(slices):
        full = list(args)
        for i, x in zip(batched_idx, slices):
            full[i] = x
        return pallas_call_p.bind(*full, **params)

    outs = lax.map(body, xs)
    return list(outs), [0] * len(outs)


def _batch_rule(args, dims, *, jaxpr, grid_mapping, checks, **params):
    gm = grid_mapping
    sizes = {x.shape[d] for x, d in zip(args, dims) if d is not jc.not_mapped}
    if len(sizes) != 1:
        raise ValueError(f"vmap of pallas_call got inconsistent batch sizes {sizes}")
    (size,) = sizes
    nsp = gm.num_scalar_prefetch
    all_params = dict(params, jaxpr=jaxpr, grid_mapping=gm, checks=checks)
    # Dynamic grid sizes are the first operands; batched ones (a grid per batch element)
    # run as a loop of unbatched calls.
    nb = gm.num_dynamic_grid_bounds
    if any(d is not jc.not_mapped for d in dims[:nb]):
        return _loop_fallback(args, dims, size, all_params)
    bounds, args, dims = list(args[:nb]), list(args[nb:]), list(dims[nb:])
    prefetch_aliased = any(i < nsp for i, _ in gm.input_output_aliases)
    if (any(d is not jc.not_mapped for d in dims[:nsp]) or prefetch_aliased
            or (checks is not None and checks.any)):
        return _loop_fallback([*bounds, *args], [jc.not_mapped] * nb + dims, size,
                              all_params)

    args = [_move_to_front(x, d, size) for x, d in zip(args, dims)]
    batched = [d is not jc.not_mapped for d in dims]
    # An unbatched input aliased to an output (which is batched) is broadcast.
    for i, _o in gm.input_output_aliases:
        if not batched[i]:
            args[i] = jnp.broadcast_to(args[i], (size, *jnp.shape(args[i])))
            batched[i] = True
    n_grid = len(gm.grid)
    in_bms = [batch_block_mapping(bm, size, n_grid, batched[nsp + k])
              for k, bm in enumerate(gm.in_block_mappings)]
    out_bms = [batch_block_mapping(bm, size, n_grid, True) for bm in gm.out_block_mappings]
    # Under shape polymorphism the batch size may be symbolic: a dynamic grid size.
    symbolic = jc.is_symbolic_dim(size)
    if symbolic:
        bounds = [jc.dimension_as_value(size).astype(jnp.int32), *bounds]
    new_gm = dataclasses.replace(
        gm,
        grid=(dynamic_grid_dim if symbolic else size, *gm.grid),
        grid_names=None if gm.grid_names is None
        else (BatchAxisName(next(_batch_axis_ids)), *gm.grid_names),
        block_mappings=(*in_bms, *out_bms),
        grid_bound_dims=(size, *gm.grid_bound_dims) if symbolic else gm.grid_bound_dims,
    )
    new_jaxpr = shift_grid_axes_closed(jaxpr, 1)
    out_avals = tuple(a.update(shape=(size, *a.shape)) for a in params["out_avals"])
    new_params = dict(params, out_avals=out_avals,
                      compiler_params=_batched_compiler_params(params["compiler_params"]),
                      cost_estimate=None if symbolic
                      else _batched_cost(params["cost_estimate"], size))
    outs = pallas_call_p.bind(*bounds, *args, jaxpr=new_jaxpr, grid_mapping=new_gm, checks=checks,
                              **new_params)
    return list(outs), [0] * len(outs)


jc.primitive_batchers[pallas_call_p] = _batch_rule

