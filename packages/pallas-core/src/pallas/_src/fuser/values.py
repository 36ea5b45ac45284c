"""``get_fusion_values``: separate a fusion's closed-over values from its computation.

A fusion closes over arrays (weights, biases, slice starts). They become explicit
operands of the kernel: regular values are passed as blocked inputs; values used only
as indices (scalar prefetch) are passed as the kernel's scalar-prefetch operands.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from pallas._src import jax_compat as jc
from pallas._src.fuser.tracing import discharge_refs, make_jaxpr
from pallas._src.fuser.usage import Usage, compute_usage


def make_scalar_prefetch_handler(*path: int) -> Callable:
    """Finds the fusion's scalar-prefetch values among the kernel's prefetch operands.

    ``make_scalar_prefetch_handler(0)`` takes the first prefetch operand (a tuple);
    with no arguments the prefetch operands are the values themselves.
    """

    def handler(*scalar_prefetch):
        result = scalar_prefetch
        for i in path:
            result = result[i]
        return result

    return handler


def _fusion_values(fusion: Callable, args, kwargs, *, discharge: bool = False,
                   extra_outputs: bool = False):
    jaxpr, values, _, out_tree = make_jaxpr(fusion, *args, **kwargs)
    if not discharge and any(isinstance(v, jax.ref.Ref) for v in values):
        raise ValueError(
            "pallas.fuser.get_fusion_values: the fusion closes over a Ref; Ref values are "
            "only supported by get_stateful_input_fusion_values and "
            "get_stateful_output_fusion_values")
    aliases: dict[int, int] = {}
    if discharge:
        jaxpr, used, aliases = discharge_refs(jaxpr, allow_additional_outputs=extra_outputs,
                                              dce=True)
        values = [v for v, u in zip(values, used) if u]
    read_usage = compute_usage(jaxpr, [{Usage.REGULAR}] * len(jaxpr.outvars))
    is_prefetch = [Usage.SCALAR_PREFETCH in read_usage(v) for v in jaxpr.constvars]
    regular = tuple(v for v, p in zip(values, is_prefetch) if not p)
    prefetch = tuple(v for v, p in zip(values, is_prefetch) if p)
    n_out = out_tree.num_leaves

    def fn(values, *args, **kwargs):
        values, prefetch_iter = iter(values), iter(prefetch)
        merged = [next(prefetch_iter) if p else next(values) for p in is_prefetch]
        flat_args = jax.tree.leaves((args, kwargs))
        outs = jc.eval_jaxpr(jaxpr, merged, *flat_args)
        if discharge and len(outs) > n_out:
            result = jax.tree.unflatten(out_tree, outs[:n_out])
            return (result, tuple(outs[n_out:])) if extra_outputs else result
        return jax.tree.unflatten(out_tree, outs)

    if discharge and extra_outputs:
        return fn, regular, prefetch, aliases
    return fn, regular, prefetch


def get_fusion_values(fusion: Callable, *args, **kwargs) -> tuple[Callable, tuple, tuple]:
    """``(fn, values, scalar_prefetch_values)`` with ``fn(values, *args)`` == ``fusion(*args)``.

    ``values`` are the arrays ``fusion`` closes over and computes with; the
    ``scalar_prefetch_values`` (e.g. dynamic-slice starts) stay closed over by ``fn``
    and are what a kernel passes as scalar prefetch.
    """
    return _fusion_values(fusion, args, kwargs)


def get_stateful_input_fusion_values(fusion: Callable, *args, **kwargs):
    """As :func:`get_fusion_values`, for an input fusion that reads closed-over Refs."""
    return _fusion_values(fusion, args, kwargs, discharge=True)


def get_stateful_output_fusion_values(fusion: Callable, *args, **kwargs):
    """As :func:`get_fusion_values`, for an output fusion that writes closed-over Refs.

    Returns ``(fn, values, scalar_prefetch_values, aliases)``; ``fn`` returns ``(out,
    new_ref_values)`` and ``aliases`` maps each extra output to the value it updates.
    """
    return _fusion_values(fusion, args, kwargs, discharge=True, extra_outputs=True)


