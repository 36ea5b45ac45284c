"""``pallas_call_p`` under ``jax.jit`` with sharded operands: JAX's partitioner splits
the grid.

The lowering of a call over several devices goes through JAX's public custom
partitioning (``jax.experimental.custom_partitioning``): the Shardy rule (or, with the
GSPMD partitioner, the inference callback) says which operand dimensions follow which
grid axis (:mod:`pallas._src.sharding_rule`); the partition callback then gives every
device the same kernel on its local blocks and its part of the grid, with
``program_id`` offset by the device's position in the mesh, and reshards (gathers) what
cannot be split, once, with a warning (``pl.sharding_gather``).
"""

from __future__ import annotations

import contextvars
import dataclasses
import itertools
import math
import warnings

import jax
from jax.experimental.custom_partitioning import (
    ArrayMapping,
    SdyShardingRule,
    custom_partitioning,
)
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pallas._src import config
from pallas._src import jax_compat as jc
from pallas._src.sharding_rule import PartitionRule, derive_rule
from pallas._src.transforms.grid_axes import offset_grid_indices


class ShardingGatherWarning(UserWarning):
    """A sharded operand of a partitioned ``pallas_call`` is gathered along a dimension
    that no independent grid axis tiles."""


# Set while a partitioned call is lowered, so the call inside it lowers as it is.
_lowering_partitioned: contextvars.ContextVar = contextvars.ContextVar(
    "pallas_lowering_partitioned", default=False)


def wants_partitioning(ctx, grid_mapping, checks) -> bool:
    """Whether this lowering is of a call that JAX's partitioner will split over devices:
    under ``jit`` over several devices (not inside ``shard_map``), not for
    ``jax.export``, with a static grid and no interpreter checks (whose error vector is
    one device's)."""
    if _lowering_partitioned.get():
        return False
    axis_ctx = ctx.module_context.axis_context
    if not isinstance(axis_ctx, jc.ShardingContext) or axis_ctx.num_devices <= 1:
        return False
    if jc.lowering_for_export(ctx) or grid_mapping.num_dynamic_grid_bounds:
        return False
    return checks is None or not checks.any


def lower_partitioned(ctx, *in_nodes, bind, **params):
    """Emits the call as a custom-partitioned one (``params``: ``pallas_call_p``'s;
    ``bind(args, params)`` binds it, as the devices' local calls do)."""
    gm, jaxpr = params["grid_mapping"], params["jaxpr"]
    rule = derive_rule(gm, jaxpr, params["compiler_params"])
    mode = config.sharding_gather.value
    n_pf = gm.num_scalar_prefetch
    n_ops = len(in_nodes)

    def call(*args):
        return bind(args, params)

    def plan(mesh, arg_shapes, result_shapes):
        return _Plan.make(rule, gm, params["name"], mesh, arg_shapes, result_shapes, n_pf)

    def partition(mesh, arg_shapes, result_shape):
        p = plan(mesh, arg_shapes, result_shape)
        p.report(mode)
        return mesh, p.local_fn(params, jaxpr, bind), p.result_shardings(), p.arg_shardings()

    def infer(mesh, arg_shapes, result_shape):
        return plan(mesh, arg_shapes, None).result_shardings()

    cp = custom_partitioning(call)
    cp.def_partition(partition, infer_sharding_from_operands=infer,
                     sharding_rule=_sdy_rule(rule, gm, n_ops))
    token = _lowering_partitioned.set(True)
    try:
        plain = ctx.replace(avals_in=[_plain(a) for a in ctx.avals_in],
                            avals_out=[_plain(a) for a in ctx.avals_out])
        return jc.mlir.lower_fun(lambda *a: cp(*a), multiple_results=True)(plain, *in_nodes)
    finally:
        _lowering_partitioned.reset(token)


def _plain(a):
    if isinstance(a, jc.ShapedArray):
        return jc.ShapedArray(a.shape, a.dtype, weak_type=a.weak_type)
    return a


def _sdy_rule(rule: PartitionRule, gm, n_ops: int) -> SdyShardingRule:
    """Shardy's rule: dimensions that a splittable grid axis tiles share its factor (one
    per axis and dimension size); every other dimension has a factor of its own. Those
    of inputs are left free, so the partition callback sees how they are sharded and can
    say what it gathers; those of outputs need replication."""
    n_pf = gm.num_scalar_prefetch
    operands, results, replicated = [], [], []
    counter = itertools.count()

    def mapping(shape, dims, is_result):
        factors = []
        for n, a in zip(shape, dims):
            if a is not None:
                factors.append(f"g{a}x{n}")
            else:
                f = f"u{next(counter)}"
                factors.append(f)
                if is_result:
                    replicated.append(f)
        return ArrayMapping(*factors)

    for a in gm.prefetch_avals:
        operands.append(mapping(a.shape, [None] * len(a.shape), False))
    for k, bm in enumerate(gm.block_mappings):
        m = mapping(bm.array_aval.shape, rule.dims[k], k >= gm.num_inputs)
        (operands if k < gm.num_inputs else results).append(m)
    assert len(operands) == n_ops == n_pf + gm.num_inputs, (len(operands), n_ops)
    return SdyShardingRule(operand_mappings=tuple(operands), result_mappings=tuple(results),
                           need_replication_factors=tuple(replicated))


def _spec(shape_with_sharding, ndim) -> tuple[tuple[str, ...], ...] | None:
    """Per dimension, the mesh axes it is sharded over (``None`` if not a NamedSharding)."""
    s = getattr(shape_with_sharding, "sharding", None)
    if not isinstance(s, NamedSharding):
        return None
    spec = tuple(s.spec) + (None,) * (ndim - len(s.spec))
    return tuple(() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in spec)


@dataclasses.dataclass
class _Plan:
    """How one partitioned call is split on a given mesh."""

    rule: PartitionRule
    gm: object
    name: str
    mesh: object
    axis_mesh: dict  # split grid axis -> the mesh axes it is split over
    in_specs: list  # per pallas_call_p operand, the mesh axes of each dim
    out_specs: list
    gathers: list  # (origin, dim, old axes, why)

    @classmethod
    def make(cls, rule, gm, name, mesh, arg_shapes, result_shapes, n_pf):
        bms = gm.block_mappings
        n_in = gm.num_inputs
        old_in = [_spec(s, len(s.shape)) for s in arg_shapes]
        old_out = ([_spec(s, len(s.shape)) for s in result_shapes]
                   if result_shapes is not None else [None] * gm.num_outputs)
        known = all(s is not None for s in old_in) and not getattr(mesh, "empty", False)
        axis_mesh: dict = {}
        why_not: dict = {}
        used: set = set()
        for a in sorted(rule.splittable) if known else ():
            for k in range(len(bms)):
                if a not in rule.dims[k]:
                    continue
                d = rule.dims[k].index(a)
                old = old_in[n_pf + k] if k < n_in else old_out[k - n_in]
                axes = old[d] if old is not None else ()
                if not axes or axes == axis_mesh.get(a):
                    continue
                size = math.prod(mesh.shape[m] for m in axes)
                if a in axis_mesh:
                    why_not.setdefault(a, f"grid axis {a} is split over mesh axes "
                                          f"{axis_mesh[a]} for another operand")
                elif used & set(axes):
                    why_not[a] = (f"mesh axes {axes} already split another grid axis")
                elif rule.grid[a] % size:
                    why_not[a] = (f"grid axis {a} (size {rule.grid[a]}) does not split "
                                  f"into {size} equal parts")
                else:
                    axis_mesh[a] = axes
                    used |= set(axes)
        in_specs, out_specs, gathers = [], [], []
        for i, s in enumerate(arg_shapes):
            k = i - n_pf
            dims = rule.dims[k] if k >= 0 else (None,) * len(s.shape)
            new = tuple(axis_mesh.get(a, ()) if a is not None else () for a in dims)
            in_specs.append(new)
            old = old_in[i] or ((),) * len(new)
            for d, (o, n) in enumerate(zip(old, new)):
                if o and o != n:
                    if k < 0:
                        origin, why = (f"scalar prefetch args[{i}]",
                                       "scalar-prefetch operands are passed whole")
                    else:
                        origin = bms[k].origin
                        a = dims[d]
                        why = (rule.dim_reasons[k][d] if a is None
                               else why_not.get(a, f"grid axis {a} is split over mesh "
                                                   f"axes {axis_mesh.get(a, ())}"))
                    gathers.append((origin, d, o, n, why))
        for k in range(n_in, len(bms)):
            out_specs.append(tuple(axis_mesh.get(a, ()) if a is not None else ()
                                   for a in rule.dims[k]))
        return cls(rule, gm, name, mesh, axis_mesh, in_specs, out_specs, gathers)

    def _sharding(self, spec):
        return NamedSharding(self.mesh, P(*(None if not e else e[0] if len(e) == 1 else e
                                            for e in spec)))

    def arg_shardings(self):
        return tuple(self._sharding(s) for s in self.in_specs)

    def result_shardings(self):
        return [self._sharding(s) for s in self.out_specs]

    def report(self, mode: str) -> None:
        """Warns about (or refuses) each dimension that is gathered."""
        if not self.gathers or mode == "allow":
            return
        lines = [
            f"operand {origin} is sharded along dimension {d} over mesh axes {old}, but "
            f"{why}; it is gathered along that dimension"
            f"{' (then split over ' + str(new) + ')' if new else ''} before the kernel "
            f"runs" for origin, d, old, new, why in self.gathers]
        msg = (f"pallas_call {self.name}: " + "; ".join(lines) + ". pl.sharding_gather("
               "'error') (or PALLAS_SHARDING_GATHER=error) makes this an error, "
               "pl.sharding_gather('allow') silences it.")
        if mode == "error":
            raise ValueError(msg)
        warnings.warn(msg, ShardingGatherWarning, stacklevel=2)

    def local_fn(self, params, jaxpr, bind):
        """The function every device runs: the kernel on its local blocks with its part
        of the grid, ``program_id`` offset by its position along each split axis."""
        rule, gm = self.rule, self.gm
        parts = {a: math.prod(self.mesh.shape[m] for m in axes)
                 for a, axes in self.axis_mesh.items()}
        grid = list(gm.grid)
        for a, n in parts.items():
            grid[a] //= n
        bms = []
        for k, bm in enumerate(gm.block_mappings):
            shape = [n // parts[a] if a in parts else n
                     for n, a in zip(bm.array_aval.shape, rule.dims[k])]
            bms.append(dataclasses.replace(
                bm, array_aval=jc.ShapedArray(tuple(shape), bm.array_aval.dtype)))
        local_gm = dataclasses.replace(gm, grid=tuple(grid), block_mappings=tuple(bms))
        out_avals = tuple(b.array_aval for b in bms[gm.num_inputs:])
        offset_axes = [a for a in sorted(parts) if a in rule.reads_index]

        def params_at(shard_ids):
            offsets = {a: 0 for a in parts}
            offsets.update({a: s * grid[a] for a, s in zip(offset_axes, shard_ids)})
            body = offset_grid_indices(jaxpr.jaxpr, offsets, gm.grid, gm.grid_names)
            return {**params, "grid_mapping": local_gm, "out_avals": out_avals,
                    "jaxpr": jc.ClosedJaxpr(body, jaxpr.consts)}

        if not offset_axes:
            local_params = params_at(())
            return lambda *args: bind(args, local_params)
        shard_ids = list(itertools.product(*(range(parts[a]) for a in offset_axes)))
        branches = [lambda *args, p=params_at(ids): bind(args, p) for ids in shard_ids]
        axes = [self.axis_mesh[a] for a in offset_axes]

        def local(*args):
            index = 0
            for a, names in zip(offset_axes, axes):
                index = index * parts[a] + jax.lax.axis_index(names)
            return jax.lax.switch(index, branches, *args)

        return local



def split_call(params, mesh, arg_shapes, bind):
    """What every device runs for one ``pallas_call_p`` (its equation's ``params``) whose
    operands (``arg_shapes``, with NamedShardings on ``mesh``) are sharded: the
    per-device function and the operand and result shardings it takes and gives, as
    the partition callback returns them (for inspecting a backend's per-device
    lowering, e.g. inside ``shard_map`` for another platform); ``bind(args, params)``
    binds ``pallas_call_p`` (:func:`pallas._src.pallas_call.split_call` passes it)."""
    gm, jaxpr = params["grid_mapping"], params["jaxpr"]
    rule = derive_rule(gm, jaxpr, params["compiler_params"])
    p = _Plan.make(rule, gm, params["name"], mesh, arg_shapes, None, gm.num_scalar_prefetch)
    return p.local_fn(params, jaxpr, bind), p.arg_shardings(), p.result_shardings()
