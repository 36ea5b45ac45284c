"""Refs as ``pallas_call`` operands (``jax.new_ref``/``empty_ref`` made outside the
kernel, e.g. ``pl.kernel(body, mesh=...)(x_ref, o_ref)``), as upstream: the kernel reads
and writes the ref in place.

The call is rewritten before it is bound: each ref's value is read and passed as an
input aliased to an extra output, the kernel sees that output's ref where it was given
the ref (so its writes land there), and the final value is written back into the ref.
``pallas_call_p`` itself only ever sees arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from pallas._src import block_spec as bs
from pallas._src import jax_compat as jc


def is_ref(x: Any) -> bool:
    try:
        return isinstance(jax.typeof(x), jc.AbstractRef)
    except TypeError:
        return False


def _leaf_specs(in_specs: Any, args: tuple, leaves: list) -> list:
    """The BlockSpec of each operand leaf (``no_block_spec`` where none was given)."""
    if in_specs is bs.no_block_spec:
        return [bs.no_block_spec] * len(leaves)
    specs = in_specs if isinstance(in_specs, (tuple, list)) else (in_specs,)
    if len(specs) != len(args):
        raise ValueError(f"pallas_call: {len(specs)} in_specs for {len(args)} operands")
    out = []
    for spec, arg in zip(specs, args):
        n = len(jax.tree_util.tree_leaves(arg))
        if spec is None or spec is bs.no_block_spec or isinstance(spec, bs.BlockSpec):
            out += [spec] * n  # one spec for a whole operand pytree
        else:
            out += jax.tree_util.tree_structure(arg).flatten_up_to(spec)
    return out


def call_with_ref_operands(make_call: Callable[..., Callable], args: tuple, *,
                           kernel: Callable, out_shape: Any, in_specs: Any, out_specs: Any,
                           input_output_aliases: Mapping[int, int],
                           num_scalar_prefetch: int) -> Any:
    """Runs ``pallas_call`` on ``args`` some of whose leaves are refs (see the module).

    ``make_call(kernel, out_shape, in_specs, out_specs, input_output_aliases)`` builds
    the call with everything else as the user wrote it.
    """
    leaves, tree = jax.tree_util.tree_flatten(args)
    ref_leaves = [i for i, x in enumerate(leaves) if is_ref(x)]
    pf_leaves = len(jax.tree_util.tree_leaves(args[:num_scalar_prefetch]))
    if any(i < pf_leaves for i in ref_leaves):
        raise NotImplementedError("pallas_call: a Ref as a scalar-prefetch operand is not "
                                  "supported; pass its value")
    specs = _leaf_specs(in_specs, args[num_scalar_prefetch:], leaves[pf_leaves:])
    specs = [None] * pf_leaves + specs
    outs_top = out_shape if isinstance(out_shape, (tuple, list)) else (out_shape,)
    n_out_leaves = len(jax.tree_util.tree_leaves(out_shape))
    if out_specs is bs.no_block_spec:
        out_specs_top: Sequence = [bs.no_block_spec] * len(outs_top)
    elif isinstance(out_shape, (tuple, list)):
        out_specs_top = list(out_specs)
    else:
        out_specs_top = [out_specs]
    extra_shapes = [jax.ShapeDtypeStruct(jax.typeof(leaves[i]).shape,
                                         jax.typeof(leaves[i]).dtype) for i in ref_leaves]
    extra_specs = [specs[i] for i in ref_leaves]
    aliases = dict(input_output_aliases)
    for j, i in enumerate(ref_leaves):
        if i in aliases:
            raise ValueError(f"pallas_call: operand {i} is a Ref and also in "
                             f"input_output_aliases; a Ref is updated in place already")
        aliases[i] = n_out_leaves + j
    n_args, n_outs, n_extra = len(args), len(outs_top), len(ref_leaves)

    def kernel_on_values(*refs, **kwargs):
        ins, rest = refs[:n_args], refs[n_args:]
        outs, extra, scratch = rest[:n_outs], rest[n_outs:n_outs + n_extra], \
            rest[n_outs + n_extra:]
        in_leaves = list(jax.tree_util.tree_leaves(ins))
        for j, i in enumerate(ref_leaves):
            in_leaves[i] = extra[j]  # the kernel writes where the ref's value ends up
        ins = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(ins), in_leaves)
        return kernel(*ins, *outs, *scratch, **kwargs)

    values = list(leaves)
    for i in ref_leaves:
        values[i] = leaves[i][...]
    call = make_call(kernel_on_values, (*outs_top, *extra_shapes),
                     in_specs, (*out_specs_top, *extra_specs), aliases)
    results = call(*jax.tree_util.tree_unflatten(tree, values))
    results = list(results)
    for j, i in enumerate(ref_leaves):
        leaves[i][...] = results[n_outs + j]
    mine = results[:n_outs]
    if isinstance(out_shape, (tuple, list)):
        return type(out_shape)(mine) if isinstance(out_shape, list) else tuple(mine)
    return mine[0]
