"""How primitives that access a ref print in jaxprs: the ref as ``a[i]``, as JAX prints
its own ``ref[i]`` reads and writes, instead of a ref, flattened index leaves and params.

A read prints ``b <- a[:3,:]``, a write ``a[:3,:] <- v``, a swap ``b, a[i] <- a[i], v``,
and any other access ``b = name[params] a[i] v``; masks and fills follow as ``mask=m``.
Each primitive describes where its ref, index leaves and operands sit with a ``split``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

from pallas._src import jax_compat as jc

pp = jc.pp

FORMS = ("read", "write", "op")


@dataclasses.dataclass(frozen=True)
class RefAccess:
    """One equation's ref access: the ref variable, its transforms (with variables for
    leaves), positional operands, and operands printed as ``label=var``."""

    ref: Any
    transforms: Any
    operands: Sequence[Any] = ()
    keywords: Sequence[tuple[str, Any]] = ()


def transforms_of(eqn, start: int, tree) -> tuple[Any, int]:
    """The transforms whose leaves are ``eqn.invars[start:]`` (per ``tree``), and the
    position just after them."""
    end = start + tree.num_leaves
    return jax.tree_util.tree_unflatten(tree, eqn.invars[start:end]), end


def _dropped(var, context) -> bool:
    return isinstance(var, jc.DropVar) or context.var_names.get(var) == "_"


def _arrow(eqn, settings):
    annotation = (jc.source_info_util.summarize(eqn.source_info)
                  if settings.source_info else None)
    return pp.text(" <- ", annotation=annotation)


def _printer(form: str, split: Callable[[Any], RefAccess], hidden: frozenset):
    def rule(eqn, context, settings):
        access = split(eqn)
        ref = jc.pp_ref_transforms(context, access.ref, tuple(access.transforms or ()))
        tail = []
        for label, var in access.keywords:
            tail += [pp.text(f" {label}="), jc.pp_var(var, context)]
        outs = [v for v in eqn.outvars if not _dropped(v, context)]
        lhs = jc.pp_vars(outs, context, print_shapes=settings.print_shapes, is_binder=True)
        vals = [jc.pp_var(v, context) for v in access.operands]
        if form == "read":
            return pp.concat([lhs, _arrow(eqn, settings), ref, *tail])
        if form == "write":
            if not outs:
                return pp.concat([ref, _arrow(eqn, settings), *vals, *tail])
            return pp.concat([lhs, pp.text(", "), ref, _arrow(eqn, settings), ref,
                              pp.text(", "), pp.join(pp.text(", "), vals), *tail])
        params = [(k, eqn.params[k]) for k in sorted(eqn.params) if k not in hidden]
        rhs = [pp.text(eqn.primitive.name), jc.pp_kv_pairs(params, context, settings),
               pp.text(" "), ref]
        rhs += [pp.text(" ") + v for v in vals]
        if not outs:
            return pp.concat([*rhs, *tail])
        return pp.concat([lhs, pp.text(" = "), *rhs, *tail])
    return rule


def register_ref_access_printer(prim, form: str, split: Callable[[Any], RefAccess], *,
                                hidden: Sequence[str] = ("tree",)) -> None:
    """Prints ``prim``'s equations with their ref access spelled ``a[i]``.

    ``form`` is ``"read"`` (``b <- a[i]``), ``"write"`` (``a[i] <- v``, or a swap's
    ``b, a[i] <- a[i], v`` when the old value is used) or ``"op"`` (``b = name a[i] v``,
    with the params not in ``hidden``); ``split(eqn)`` returns its :class:`RefAccess`.
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, not {form!r}")
    jc.pp_eqn_rules[prim] = _printer(form, split, frozenset(hidden))
