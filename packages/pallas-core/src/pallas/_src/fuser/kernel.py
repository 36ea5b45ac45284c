"""The kernel function of a pulled fusion: one output block from one block per input.

Each equation runs its eval rule, which knows the block specs of its operands and
results and, through :class:`KernelEvalContext`, the program ids and block indices.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from pallas._src import block_spec as bs
from pallas._src import jax_compat as jc
from pallas._src.fuser import transforms as tf
from pallas._src.fuser.registry import eval_rules, known
from pallas._src.fuser.usage import Usage


@dataclasses.dataclass(frozen=True)
class KernelEvalContext:
    """What an eval rule knows: the program, block specs and scalar prefetch."""

    scalar_prefetch: Any | None
    program_ids: tuple[Any, ...] | None
    avals_in: tuple[Any, ...] | None
    avals_out: tuple[Any, ...] | None
    in_block_specs: tuple[Any, ...]
    out_block_specs: tuple[Any, ...]
    grid_len: int | None
    scalar_prefetch_handler: Any | None
    out_usages: tuple[set, ...] | None

    def get_program_ids(self):
        if self.program_ids is None:
            raise ValueError("Program ids not available.")
        return self.program_ids

    def _indices(self, specs):
        with tf.scalar_prefetch_context(*(self.scalar_prefetch or ())):
            return tuple(
                None if spec is bs.no_block_spec or spec.index_map is None
                else tf.as_tuple(spec.index_map(*self.get_program_ids()))
                for spec in specs
            )

    def get_in_block_indices(self):
        return self._indices(self.in_block_specs)

    def get_out_block_indices(self):
        return self._indices(self.out_block_specs)


def _unblocked(specs) -> bool:
    return all(s is bs.no_block_spec or s.block_shape is None for s in specs)


def make_kernel_function(jaxpr, consts, in_tree, out_tree, read_usage, in_specs, env_specs,
                         sp_fns, scalar_prefetch_handler, grid_len):
    """``kernel_fn(program_ids, scalar_prefetch, *args, **kwargs)`` for a pulled jaxpr."""
    invar_usages = [read_usage(v) for v in jaxpr.invars]

    def spec_of(v):
        if isinstance(v, jc.Literal):
            return bs.no_block_spec
        return env_specs.get(v, bs.no_block_spec)

    def kernel_fn(program_ids, scalar_prefetch, *args, **kwargs):
        flat_args, tree = jax.tree.flatten((args, kwargs))
        if tree != in_tree:
            raise ValueError(
                f"pallas.fuser kernel function: expected arguments structured as {in_tree} "
                f"(one block per argument of the fused function), got {tree}")
        env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts))
        for v, x, usage in zip(jaxpr.invars, flat_args, invar_usages):
            if Usage.REGULAR in usage:
                env[v] = x

        def read(v):
            return v.val if isinstance(v, jc.Literal) else env.get(v)

        for i, eqn in enumerate(jaxpr.eqns):
            out_usages = tuple(read_usage(v) for v in eqn.outvars)
            if not any(Usage.REGULAR in u for u in out_usages):
                continue
            in_vals = [read(v) for v in eqn.invars]
            if (sp_fn := sp_fns.get(i)) is not None:
                with tf.scalar_prefetch_context(*(scalar_prefetch or ())):
                    sp_vals = iter(sp_fn())
                for k, v in enumerate(eqn.invars):
                    if isinstance(v, jc.Literal):
                        next(sp_vals)
                    elif read_usage(v) == {Usage.SCALAR_PREFETCH}:
                        in_vals[k] = next(sp_vals)
                    elif Usage.SCALAR_PREFETCH in read_usage(v):
                        next(sp_vals)
            out_specs = tuple(spec_of(v) for v in eqn.outvars)
            eqn_in_specs = tuple(spec_of(v) for v in eqn.invars)
            rule = eval_rules.get(eqn.primitive)
            if _unblocked(out_specs) and _unblocked(eqn_in_specs):
                rule = None  # whole values in and out: the primitive itself computes them
            elif rule is None:
                raise NotImplementedError(
                    f"pallas.fuser has no eval rule for `{eqn.primitive.name}` on blocks "
                    f"(output block specs: {[tf.describe(s) for s in out_specs]}); "
                    f"primitives with eval rules: {known(eval_rules)}")
            if rule is None:
                params = eqn.primitive.get_bind_params(eqn.params)
                outs = eqn.primitive.bind(*in_vals, **params)
            else:
                ctx = KernelEvalContext(
                    scalar_prefetch=scalar_prefetch,
                    program_ids=tuple(program_ids),
                    avals_in=tuple(v.aval for v in eqn.invars),
                    avals_out=tuple(v.aval for v in eqn.outvars),
                    in_block_specs=eqn_in_specs,
                    out_block_specs=out_specs,
                    grid_len=grid_len,
                    scalar_prefetch_handler=scalar_prefetch_handler,
                    out_usages=out_usages,
                )
                outs = rule(ctx, *in_vals, **eqn.params)
            if not eqn.primitive.multiple_results:
                outs = [outs]
            for v, x in zip(eqn.outvars, outs):
                env[v] = x
        return jax.tree.unflatten(out_tree, [read(v) for v in jaxpr.outvars])

    return kernel_fn
