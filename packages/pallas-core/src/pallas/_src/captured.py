"""Values a kernel body closes over, as upstream: refs made outside it (``jax.new_ref``,
``pl.run_state``) become operands of a ``pallas_call`` or ``pl.kernel``, and traced
scalars (``i`` in ``x_ref.at[i]``) of a ``pl.kernel``.

The body was traced once already; its jaxpr has the captured values as constants. The
call is made again with one more operand per captured value: a scalar in the mesh's
scalar memory (SMEM on a TPU), a ref as a ref operand (updated in place, see
``ref_args``). The new kernel evaluates the traced jaxpr with those operands, read (a
scalar) or as they are (a ref), in the constants' places.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from pallas._src import block_spec as bs
from pallas._src import jax_compat as jc
from pallas._src.ref_args import is_ref


def _hoisted(c: Any, scalars: bool = True) -> bool:
    return is_ref(c) or (scalars and isinstance(c, jax.core.Tracer) and jnp.ndim(c) == 0)


def hoistable(consts, *, scalars: bool = True) -> bool:
    """Whether some captured constants are refs or (with ``scalars``, as ``pl.kernel``
    takes them) traced scalars; the rest, concrete values, stay constants."""
    return any(_hoisted(c, scalars) for c in consts)


def call_hoisting_captures(remake: Callable[..., Callable], closed: Any, args: tuple, *,
                           out_shape: Any, in_specs: Any, out_specs: Any,
                           input_output_aliases: Mapping[int, int], ref_space: Any,
                           scalar_space: Any, scalars: bool = True,
                           num_scalar_prefetch: int = 0) -> Any:
    """Runs the call on ``args`` plus the captured scalars and refs of ``closed`` (the
    traced kernel) as operands; ``remake`` as in ``ref_args.call_with_ref_operands``."""
    consts = list(closed.consts)
    lifted = [i for i, c in enumerate(consts) if _hoisted(c, scalars)]
    n_args = len(args)
    extra_args, extra_specs = [], []
    for i in lifted:
        c = consts[i]
        if is_ref(c):
            extra_args.append(c)
            extra_specs.append(bs.BlockSpec(memory_space=ref_space))
        else:
            extra_args.append(jnp.reshape(c, (1,)))
            extra_specs.append(bs.BlockSpec(memory_space=scalar_space))
    # Scalar-prefetch operands (the first ``num_scalar_prefetch``) take no spec.
    specs = (list(in_specs) if isinstance(in_specs, (tuple, list))
             else [in_specs] * (n_args - num_scalar_prefetch))

    def kernel_from_jaxpr(*refs, **kwargs):
        lifted_refs = refs[n_args:n_args + len(lifted)]
        flat = [*jax.tree_util.tree_leaves(refs[:n_args]),
                *jax.tree_util.tree_leaves(refs[n_args + len(lifted):]),
                *jax.tree_util.tree_leaves(kwargs)]
        values = list(consts)
        for i, r in zip(lifted, lifted_refs):
            values[i] = r if is_ref(consts[i]) else r[0]
        jc.eval_jaxpr(closed.jaxpr, values, *flat)

    call = remake(kernel_from_jaxpr, out_shape, (*specs, *extra_specs), out_specs,
                  dict(input_output_aliases))
    return call(*args, *extra_args)
