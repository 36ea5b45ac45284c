"""``pull_block_spec``: from the block specs of a fusion's outputs to those of its inputs.

The fusion is traced to a jaxpr and walked backwards; each primitive's pull rule maps
the block index transforms of its outputs to those of its inputs (``rules_*.py``). The
result is a BlockSpec per input and a kernel function that computes one output block
from one block of each input, by running each primitive's eval rule.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax

from pallas._src import jax_compat as jc
from pallas._src.fuser import transforms as tf
from pallas._src.fuser.kernel import make_kernel_function
from pallas._src.fuser.registry import known, pull_block_spec_rules
from pallas._src.fuser.tracing import make_jaxpr
from pallas._src.fuser.usage import Usage, compute_usage


@dataclasses.dataclass
class PullRuleContext:
    """What a pull rule knows about its equation."""

    avals_in: tuple[Any, ...]
    avals_out: tuple[Any, ...]
    out_usages: tuple[set, ...]
    scalar_prefetch_handler: Any | None
    grid_len: int | None
    strict_mode: bool = True
    # For equations with scalar-prefetch operands (e.g. dynamic_slice starts): returns
    # their values (and those of literal operands), in operand order, inside an index map.
    scalar_prefetch_fn: Callable[[], list] | None = dataclasses.field(default=None, init=False)


def _where(eqn) -> str:
    try:
        return f" (at {jc.source_info_util.summarize(eqn.source_info)})"
    except Exception:  # noqa: BLE001 - a location is a nicety
        return ""


def _unsupported(eqn, out_transforms) -> NotImplementedError:
    specs = ", ".join(tf.describe(t) for t in out_transforms)
    return NotImplementedError(
        f"pallas.fuser cannot pull a block spec through `{eqn.primitive.name}`{_where(eqn)}: "
        f"its output block spec ({specs}) has no pull rule to map it to the operands "
        f"{[str(v.aval) for v in eqn.invars]}. Primitives with pull rules: "
        f"{known(pull_block_spec_rules)}. Register one with "
        f"pallas.fuser.register_pull_block_spec_rule({eqn.primitive.name}_p) or move the "
        f"operation out of the fusion."
    )


def _scalar_prefetch_fn(jaxpr, eqn_index: int, eqn, read_usage, handler, grid_len):
    """A function computing ``eqn``'s scalar-prefetch operands from the prefetch values."""
    eqn_invars = list(eqn.invars)
    needed = [v for v in eqn_invars
              if isinstance(v, jc.Literal) or Usage.SCALAR_PREFETCH in read_usage(v)]
    prefix = jaxpr.replace(outvars=needed, eqns=jaxpr.eqns[:eqn_index],
                           debug_info=jaxpr.debug_info.with_unknown_names())
    prefix, used_consts, used_invars = jc.dce_jaxpr_consts(prefix, [True] * len(needed))
    if any(used_invars):
        raise ValueError(
            f"pallas.fuser: the scalar operands of `{eqn.primitive.name}`{_where(eqn)} depend "
            "on an input of the fusion, not only on closed-over values; they must be known "
            "from scalar prefetch (pass them through get_fusion_values)."
        )
    positions = [i for i, used in enumerate(used_consts) if used]

    def fn():
        if grid_len is None:
            raise ValueError("pallas.fuser.pull_block_spec needs grid_len= when the fusion "
                             "reads scalar-prefetch values")
        if handler is None:
            raise ValueError("pallas.fuser.pull_block_spec needs scalar_prefetch_handler= "
                             "when the fusion reads scalar-prefetch values")
        values = handler(*tf.current_scalar_prefetch())
        args = [values[i][0] for i in positions]  # each is a (1,)-shaped SMEM operand
        return jc.eval_jaxpr(prefix, args)

    return fn


def pull_transforms(jaxpr, out_transforms, *, read_usage, scalar_prefetch_handler=None,
                    grid_len=None, strict_mode: bool = True):
    """Walks ``jaxpr`` backwards: (input transforms, {var: transform}, {eqn: sp fn})."""
    env: dict[Any, Any] = {}
    index_avals = tf.index_avals_of(out_transforms)

    def write(v, t) -> None:
        if isinstance(v, jc.Literal):
            return
        if v in env and not tf.transforms_equal(env[v], t, index_avals, strict=strict_mode):
            env[v] = tf.CONFLICT
        else:
            env[v] = t

    for v, t in zip(jaxpr.outvars, out_transforms, strict=True):
        write(v, t)
    sp_fns: dict[int, Callable] = {}
    for i in reversed(range(len(jaxpr.eqns))):
        eqn = jaxpr.eqns[i]
        outs = tuple(env.get(v, tf.no_block_index_transform) for v in eqn.outvars)
        if all(t is tf.no_block_index_transform for t in outs):
            continue
        if any(t is tf.CONFLICT for t in outs):
            raise _dag_error(jaxpr, eqn)
        rule = pull_block_spec_rules.get(eqn.primitive)
        if rule is None:
            raise _unsupported(eqn, outs)
        ctx = PullRuleContext(
            avals_in=tuple(v.aval for v in eqn.invars),
            avals_out=tuple(v.aval for v in eqn.outvars),
            out_usages=tuple(read_usage(v) for v in eqn.outvars),
            scalar_prefetch_handler=scalar_prefetch_handler,
            grid_len=grid_len,
            strict_mode=strict_mode,
        )
        if any(Usage.SCALAR_PREFETCH in read_usage(v) for v in eqn.invars
               if not isinstance(v, jc.Literal)):
            ctx.scalar_prefetch_fn = sp_fns[i] = _scalar_prefetch_fn(
                jaxpr, i, eqn, read_usage, scalar_prefetch_handler, grid_len)
        ins = rule(ctx, outs if eqn.primitive.multiple_results else outs[0], **eqn.params)
        ins = list(ins)
        if len(ins) != len(eqn.invars):
            raise ValueError(
                f"the pull rule of `{eqn.primitive.name}` returned {len(ins)} block "
                f"transforms for {len(eqn.invars)} operands")
        for v, t in zip(eqn.invars, ins):
            write(v, t)

    def input_transform(v):
        if read_usage(v) == {Usage.SCALAR_PREFETCH}:
            return None
        t = env.get(v, tf.no_block_index_transform)
        if t is tf.CONFLICT:
            raise _dag_error(jaxpr, None)
        return t

    return tuple(input_transform(v) for v in jaxpr.invars), env, sp_fns


def _dag_error(jaxpr, eqn) -> ValueError:
    where = f" (a value used by `{eqn.primitive.name}`{_where(eqn)})" if eqn else ""
    return ValueError(
        "Fusion contains a DAG, cannot uniquely pull block specs: a value is used twice "
        f"with different blocks{where}; fuse each use separately.\n{jaxpr}")


def pull_jaxpr(jaxpr, out_specs, *, read_usage, scalar_prefetch_handler=None,
               grid_len=None, strict_mode: bool = True):
    """Pulls BlockSpecs through ``jaxpr``: (input specs, {var: spec}, {eqn: sp fn})."""
    out_specs = tuple(out_specs)
    ins, env, sp_fns = pull_transforms(
        jaxpr, tf.initial_transforms(out_specs), read_usage=read_usage,
        scalar_prefetch_handler=scalar_prefetch_handler, grid_len=grid_len,
        strict_mode=strict_mode)
    env_specs = {v: tf.apply_transform(out_specs, t) for v, t in env.items()
                 if t is not tf.CONFLICT}
    in_specs = tuple(tf.apply_transform(out_specs, t) for t in ins)
    return in_specs, env_specs, sp_fns


def pull_block_spec(
    f: Callable,
    out_block_specs,
    *,
    scalar_prefetch_handler: Any | None = None,
    grid_len: int | None = None,
    strict_mode: bool = True,
) -> Callable:
    """Pulls the BlockSpecs of ``f``'s outputs back to its inputs.

    Returns a function of ``f``'s arguments (arrays or ``jax.ShapeDtypeStruct``s) giving
    ``(kernel_fn, arg_block_specs, kwarg_block_specs)``. ``kernel_fn(program_ids,
    scalar_prefetch, *arg_blocks, **kwarg_blocks)`` computes the output blocks from the
    input blocks, inside a kernel. Index maps take ``(*grid_indices, *scalar_prefetch)``.
    """

    def wrapped(*args, **kwargs):
        jaxpr, consts, in_tree, _ = make_jaxpr(f, *args, **kwargs)
        memo: dict[int, Any] = {}

        def ambient(spec):
            return memo.setdefault(id(spec), tf.reads_scalar_prefetch(spec))

        flat_specs, spec_tree = jax.tree.flatten(jax.tree.map(ambient, out_block_specs))
        if len(flat_specs) != len(jaxpr.outvars):
            raise ValueError(
                f"pallas.fuser.pull_block_spec: the function has {len(jaxpr.outvars)} "
                f"outputs but {len(flat_specs)} output block specs were given")
        jaxpr, used_consts, _ = jc.dce_jaxpr_consts(
            jaxpr, [True] * len(jaxpr.outvars), instantiate=True)
        consts = [c for c, used in zip(consts, used_consts) if used]
        read_usage = compute_usage(jaxpr, [{Usage.REGULAR}] * len(jaxpr.outvars))
        in_specs, env_specs, sp_fns = pull_jaxpr(
            jaxpr, flat_specs, read_usage=read_usage,
            scalar_prefetch_handler=scalar_prefetch_handler, grid_len=grid_len,
            strict_mode=strict_mode)
        kernel_fn = make_kernel_function(
            jaxpr, consts, in_tree, spec_tree, read_usage, in_specs, env_specs, sp_fns,
            scalar_prefetch_handler, grid_len)
        in_specs = jax.tree.unflatten(in_tree, in_specs)
        in_specs = jax.tree.map(functools.partial(tf.takes_scalar_prefetch, grid_len=grid_len),
                                in_specs)
        arg_specs, kwarg_specs = in_specs
        return kernel_fn, arg_specs, kwarg_specs

    return wrapped
