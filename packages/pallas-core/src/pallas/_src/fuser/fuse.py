"""``fuse``: fuse the computation around one ``fusible`` call into that call.

``fuse(f)`` traces ``f``, finds its ``fusible`` equation, and calls the fusible's
function with *input fusions* (the computation producing each of its operands) and
*output fusions* (the computation consuming its results, one per leaf of its
``output_fusion_prefix``). The fusible kernel evaluates them block by block, e.g. with
:func:`pull_block_spec` and :func:`push_block_spec`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from pallas._src import jax_compat as jc
from pallas._src.fuser.dtypes import physicalize
from pallas._src.fuser.fusible import fusible_p
from pallas._src.fuser.fusion import Fusion


def _writes(eqn) -> list:
    return [e.input for e in eqn.effects if isinstance(e, (jc.WriteEffect, jc.AccumEffect))]


def depends_on(jaxpr, sources) -> tuple[list[bool], set]:
    """Which outputs of ``jaxpr`` depend on the vars in ``sources``, and which Refs
    outside ``jaxpr`` (its constvars/invars) receive writes that depend on them."""
    tainted = set(sources)
    for eqn in jaxpr.eqns:
        if any(not isinstance(v, jc.Literal) and v in tainted for v in eqn.invars):
            tainted.update(eqn.outvars)
            tainted.update(_writes(eqn))  # a Ref written with a dependent value
    outer = set(jaxpr.constvars) | set(jaxpr.invars)
    written = {r for eqn in jaxpr.eqns for r in _writes(eqn) if r in tainted and r in outer}
    return ([not isinstance(v, jc.Literal) and v in tainted for v in jaxpr.outvars],
            written - set(sources))


def _independent(eqns, sources) -> list:
    """The equations that do not depend on ``sources``."""
    tainted, out = set(sources), []
    for eqn in eqns:
        if any(not isinstance(v, jc.Literal) and v in tainted for v in eqn.invars):
            tainted.update(eqn.outvars)
            tainted.update(_writes(eqn))
        else:
            out.append(eqn)
    return out


def _check_writes_depend_on_fusible(jaxpr, rest, fusible_outs) -> None:
    """Refuses a write to a Ref from outside the fused function that does not depend on
    the fusible's outputs: such a write cannot run in an output fusion, and in an input
    fusion it would run once per block the kernel pulls."""
    outer = set(jaxpr.constvars) | set(jaxpr.invars)
    for eqn in _independent(rest, fusible_outs):
        for ref in _writes(eqn):
            if ref in outer:
                where = jc.source_info_util.summarize(eqn.source_info)
                raise ValueError(
                    f"pallas.fuser.fuse: `{eqn.primitive.name}` at {where} writes to a Ref "
                    f"({ref.aval.str_short()}) with a value that does not depend on the "
                    "fusible call's outputs. Writes to Refs in a fused function must depend "
                    "on an output of the fusible, so that they run in its output fusion; "
                    "move the write outside the fused function.")


def _sub_jaxpr(jaxpr, eqns, outvars, invars=()):
    """``jaxpr``'s constvars+invars as constvars, the given eqns, outvars and invars."""
    return jaxpr.replace(constvars=[*jaxpr.constvars, *jaxpr.invars], invars=list(invars),
                         eqns=eqns, outvars=list(outvars),
                         debug_info=jaxpr.debug_info.with_unknown_names())


def _closed(jaxpr, values, used_outputs, instantiate):
    """DCE: (jaxpr restricted to ``used_outputs``, the values of its remaining consts)."""
    jaxpr, used_consts, _ = jc.dce_jaxpr_consts(jaxpr, used_outputs, instantiate=instantiate)
    return jaxpr, [v for v, u in zip(values, used_consts) if u]


def _input_fusion(jaxpr, values, prefix_eqns, var) -> Fusion:
    if isinstance(var, jc.Literal):
        val = var.val
        return Fusion(lambda: val, ((), {}), var.aval)
    sub = _sub_jaxpr(jaxpr, prefix_eqns, [var])
    sub, consts = _closed(sub, values, [True], instantiate=False)
    return Fusion(lambda: jc.eval_jaxpr(sub, consts)[0], ((), {}), var.aval)


def _output_fusions(jaxpr, values, eqn_index, eqn, strict_mode):
    """(output fusions shaped like the prefix, order of the final outputs they produce)."""
    rest = jaxpr.eqns[:eqn_index] + jaxpr.eqns[eqn_index + 1:]
    after = _sub_jaxpr(jaxpr, rest, jaxpr.outvars, eqn.outvars)
    n_values = len(values)
    outs_tree = jax.tree.unflatten(eqn.params["out_tree"], eqn.outvars)
    prefix = jax.tree.structure(eqn.params["output_fusion_prefix"])
    groups = prefix.flatten_up_to(outs_tree)
    masks, claimed = [], set()
    for group in groups:
        used, written = depends_on(after, jax.tree.leaves(group))
        if written and len(groups) > 1:
            raise ValueError("Multiple output fusions are not currently supported for "
                             "fusions that write to Refs.")
        for i, u in enumerate(used):
            if u and i in claimed:
                raise ValueError(
                    "Outputs must be disjoint in order to use separate output fusions: "
                    f"output {i} of the fused function depends on several of them")
            if u:
                claimed.add(i)
        masks.append(used)
    fusions = []
    for group, used in zip(groups, masks):
        leaves = jax.tree.leaves(group)
        keep = [False] * n_values + [v in leaves for v in after.invars]
        sub, consts = _closed(after, values, used, instantiate=keep)
        if not sub.eqns and list(sub.outvars) == list(sub.invars):
            fusions.append(None)
            continue

        def run(sub, consts, *args, **kwargs):
            return tuple(jc.eval_jaxpr(sub, consts, *jax.tree.leaves((args, kwargs))))

        fusions.append(Fusion(
            functools.partial(run, sub, consts),
            (jax.tree.map(lambda v: v.aval, group), {}),
            tuple(v.aval for v in sub.outvars),
            strict_mode=strict_mode,
        ))
    order = [i for used in masks for i, u in enumerate(used) if u]
    return jax.tree.unflatten(prefix, fusions), order


def fuse_jaxpr(jaxpr, out_tree, consts, *args, strict_mode: bool = True):
    """Runs ``jaxpr`` with its one fusible equation fused with its surroundings."""
    del out_tree
    eqn_index = next((i for i, e in enumerate(jaxpr.eqns) if e.primitive is fusible_p), None)
    if eqn_index is None:
        raise ValueError(
            "No fusible eqn found: the function given to pallas.fuser.fuse must call a "
            "function decorated with @pallas.fuser.fusible")
    eqn = jaxpr.eqns[eqn_index]
    values = [*consts, *args]
    rest = jaxpr.eqns[:eqn_index] + jaxpr.eqns[eqn_index + 1:]
    after = _sub_jaxpr(jaxpr, rest, jaxpr.outvars, eqn.outvars)
    used, written = depends_on(after, eqn.outvars)
    if not any(used) and not written:
        # Nothing needs the fusible: run what does not depend on it.
        sub = _sub_jaxpr(jaxpr, _independent(rest, eqn.outvars), jaxpr.outvars)
        sub, sub_consts = _closed(sub, values, [True] * len(jaxpr.outvars), instantiate=False)
        return jc.eval_jaxpr(sub, sub_consts)
    _check_writes_depend_on_fusible(jaxpr, rest, eqn.outvars)
    num_consts = eqn.params["num_consts"]
    prefix_eqns = jaxpr.eqns[:eqn_index]
    in_fusions = [_input_fusion(jaxpr, values, prefix_eqns, v)
                  for v in eqn.invars[num_consts:]]
    in_fusions = jax.tree.unflatten(eqn.params["in_tree"], in_fusions)
    out_fusions, order = _output_fusions(jaxpr, values, eqn_index, eqn, strict_mode)
    flat_out = jax.tree.leaves(eqn.params["func"](*in_fusions, out_fusions))
    if len(flat_out) != len(order):
        raise ValueError(
            f"pallas.fuser.fuse: the fusible returned {len(flat_out)} values through its "
            f"output fusions, but they produce {len(order)} outputs of the fused function")
    missing = [i for i in range(len(jaxpr.outvars)) if i not in order]
    if missing:
        # Outputs that do not depend on the fusible are computed beside it.
        sub = _sub_jaxpr(jaxpr, _independent(rest, eqn.outvars),
                         [jaxpr.outvars[i] for i in missing])
        sub, sub_consts = _closed(sub, values, [True] * len(missing), instantiate=False)
        flat_out = [*flat_out, *jc.eval_jaxpr(sub, sub_consts)]
        order = [*order, *missing]
    result: list[Any] = [None] * len(order)
    for value, i in zip(flat_out, order):
        result[i] = value
    return result


def fuse(f=None, *, resolve_fusion_dtypes: bool = True, debug: bool = False,
         strict_mode: bool = True):
    """Fuses the computation around the one ``fusible`` call in ``f`` into that call.

    ``resolve_fusion_dtypes`` lowers fusion dtypes (``FusionDType``) to physical ones;
    ``debug`` prints the traced jaxpr; ``strict_mode`` compares index maps symbolically
    when an output fusion's block specs meet.
    """

    def decorator(f):
        def wrapper(*args, **kwargs):
            flat_args, in_tree = jax.tree.flatten((args, kwargs))
            ref = next((x for x in flat_args if isinstance(x, jax.ref.Ref)), None)
            if ref is not None:
                raise NotImplementedError(
                    f"Fused function {getattr(f, '__name__', f)} was passed an argument of "
                    f"type {jax.typeof(ref)}. Fused functions cannot take Refs as arguments "
                    "-- they must close over such Refs, instead.")
            dbg = jc.api_util.debug_info("fuse", f, args, kwargs)
            flat_fun, out_tree = jc.flatten_fun(jc.lu.wrap_init(f, debug_info=dbg), in_tree)
            jaxpr, _, consts = jc.trace_to_jaxpr_dynamic(
                flat_fun, [jc.typeof(x) for x in flat_args])
            if debug:
                print("Jaxpr before fusion:")
                print(jaxpr)
            out = fuse_jaxpr(jaxpr, out_tree(), consts, *flat_args, strict_mode=strict_mode)
            return jax.tree.unflatten(out_tree(), out)

        return physicalize(wrapper) if resolve_fusion_dtypes else wrapper

    return decorator(f) if f is not None else decorator
