"""Explicit MXU control: ``matmul_push_rhs``, ``matmul_acc_lhs``, ``matmul_pop``.

A TPU core's matrix units (MXUs) each have staging registers for right-hand sides and an
accumulator memory. ``matmul_push_rhs`` stages an RHS in a register; ``matmul_acc_lhs``
(optionally first loading a staged RHS into the MXU) multiplies an LHS by the MXU's
loaded RHS and adds the product into the accumulator slice at ``acc_addr``;
``matmul_pop`` returns that slice and zeroes it.

In the interpreter the staged RHSs, the loaded RHS of each MXU and the accumulators are
per-kernel-evaluation state. That state lives outside the values the interpreter threads
through control flow, so a staging register or accumulator must be used within one
control-flow scope (the kernel body, or one ``pl.when``/loop body): touching it from
another scope raises ``NotImplementedError`` rather than giving wrong numbers. Pushing
twice to a register, accumulating with no RHS loaded, and ``load_staged_rhs`` of an empty
register raise ``ValueError``.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from pallas.plugins import effect_primitive
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.primitives.effects import tpu_kernel_effect

matmul_push_rhs_p = effect_primitive("matmul_push_rhs", {tpu_kernel_effect})
matmul_acc_lhs_p = effect_primitive("matmul_acc_lhs", {tpu_kernel_effect})
matmul_pop_p = jc.Primitive("matmul_pop")

_ACC_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.int32))


def _check_2d(x, what):
    if x.ndim != 2:
        raise ValueError(f"{what}: the operand must be 2-D, got shape {x.shape}")


def matmul_push_rhs(rhs, staging_register: int, mxu_index: int, *,
                    transpose: bool = False) -> None:
    """Stages ``rhs`` (2-D) in ``staging_register`` of MXU ``mxu_index``.

    A register holds one RHS until ``matmul_acc_lhs(..., load_staged_rhs=register)``
    loads it; pushing to an occupied register is an error. ``transpose=True`` stages
    ``rhs.T``.
    """
    rhs = jnp.asarray(rhs)
    _check_2d(rhs, "matmul_push_rhs")
    matmul_push_rhs_p.bind(rhs, staging_register=int(staging_register),
                           mxu_index=int(mxu_index), transpose=bool(transpose))


def matmul_acc_lhs(acc_addr: int, lhs, mxu_index: int,
                   load_staged_rhs: int | None = None) -> None:
    """Accumulates ``lhs @ rhs`` into the accumulator slice at ``acc_addr``.

    ``rhs`` is the RHS loaded in MXU ``mxu_index``; with ``load_staged_rhs=r`` the RHS
    staged in register ``r`` is loaded first (and the register freed).
    """
    if isinstance(load_staged_rhs, bool):
        raise TypeError("load_staged_rhs must be an integer (a staging register) or None")
    lhs = jnp.asarray(lhs)
    _check_2d(lhs, "matmul_acc_lhs")
    matmul_acc_lhs_p.bind(lhs, acc_addr=int(acc_addr), mxu_index=int(mxu_index),
                          load_staged_rhs=None if load_staged_rhs is None
                          else int(load_staged_rhs))


def matmul_pop(acc_addr: int, shape, dtype, mxu_index: int):
    """Returns the ``shape`` accumulator slice at ``acc_addr`` of MXU ``mxu_index`` (as
    ``dtype``: float32 or int32) and zeroes it."""
    shape = tuple(int(d) for d in shape)
    if len(shape) != 2:
        raise ValueError(f"matmul_pop: shape must be 2-D, got {shape}")
    return matmul_pop_p.bind(acc_addr=int(acc_addr), shape=shape, dtype=jnp.dtype(dtype),
                             mxu_index=int(mxu_index))


def _pop_abstract_eval(*, shape, dtype, **_):
    if dtype not in _ACC_DTYPES:
        raise ValueError(f"matmul_pop: only float32 and int32 accumulators are supported, "
                         f"got {dtype}")
    return jc.ShapedArray(shape, dtype), {tpu_kernel_effect}


matmul_pop_p.def_effectful_abstract_eval(_pop_abstract_eval)


# -- interpreter ----------------------------------------------------------------------------

_STATE = "mosaic_tpu.mxu"


def _state(ctx) -> dict:
    return ctx.backend_state.setdefault(_STATE, {"staged": {}, "loaded": {}, "acc": {}})


def _take(ctx, table: dict, key, what: str):
    """The (value) stored under ``key``, checking it was stored in this scope."""
    entry = table.get(key)
    if entry is None:
        return None
    scope, value = entry
    if scope is not ctx:
        raise NotImplementedError(
            f"{what} was set in a different control-flow scope (outside or inside a "
            f"pl.when/cond or loop body) than where it is used; in the pallas-tpu "
            f"interpreter (backend 'mosaic_tpu') MXU staging registers and accumulators "
            f"must be pushed, accumulated and popped within one scope")
    return value


def _push_rule(ctx, eqn, invals):
    (rhs,) = invals
    p = eqn.params
    st = _state(ctx)
    key = (p["mxu_index"], p["staging_register"])
    if _take(ctx, st["staged"], key, f"staging register {key[1]} of MXU {key[0]}") is not None:
        raise ValueError(
            f"matmul_push_rhs: staging register {key[1]} of MXU {key[0]} already holds an "
            f"RHS; load it with matmul_acc_lhs(..., load_staged_rhs={key[1]}) first")
    st["staged"][key] = (ctx, rhs.T if p["transpose"] else rhs)
    return []


def _acc_dtype(*dtypes):
    return jnp.int32 if all(jnp.issubdtype(d, jnp.integer) for d in dtypes) else jnp.float32


def _acc_rule(ctx, eqn, invals):
    (lhs,) = invals
    p = eqn.params
    st = _state(ctx)
    mxu = p["mxu_index"]
    if p["load_staged_rhs"] is not None:
        key = (mxu, p["load_staged_rhs"])
        rhs = _take(ctx, st["staged"], key, f"staging register {key[1]} of MXU {mxu}")
        if rhs is None:
            raise ValueError(f"matmul_acc_lhs: staging register {key[1]} of MXU {mxu} is "
                             f"empty (push an RHS with matmul_push_rhs first)")
        del st["staged"][key]
        st["loaded"][mxu] = (ctx, rhs)
    rhs = _take(ctx, st["loaded"], mxu, f"the RHS loaded in MXU {mxu}")
    if rhs is None:
        raise ValueError(f"matmul_acc_lhs: MXU {mxu} has no RHS loaded (pass "
                         f"load_staged_rhs=<register> after matmul_push_rhs)")
    if lhs.shape[1] != rhs.shape[0]:
        raise ValueError(f"matmul_acc_lhs: LHS {lhs.shape} does not match the loaded RHS "
                         f"{rhs.shape}")
    acc_t = _acc_dtype(lhs.dtype, rhs.dtype)
    prod = lax.dot(lhs, rhs, precision=lax.Precision.HIGHEST, preferred_element_type=acc_t)
    key = (mxu, p["acc_addr"])
    cur = _take(ctx, st["acc"], key, f"accumulator {key[1]} of MXU {mxu}")
    if cur is not None:
        if cur.shape != prod.shape or cur.dtype != prod.dtype:
            raise ValueError(f"matmul_acc_lhs: accumulator {key[1]} of MXU {mxu} holds "
                             f"{cur.dtype}{list(cur.shape)}, the product is "
                             f"{prod.dtype}{list(prod.shape)}")
        prod = cur + prod
    st["acc"][key] = (ctx, prod)
    return []


def _pop_rule(ctx, eqn, invals):
    p = eqn.params
    st = _state(ctx)
    key = (p["mxu_index"], p["acc_addr"])
    cur = _take(ctx, st["acc"], key, f"accumulator {key[1]} of MXU {key[0]}")
    if cur is None:
        return [jnp.zeros(p["shape"], p["dtype"])]
    if cur.shape != p["shape"]:
        raise ValueError(f"matmul_pop: accumulator {key[1]} of MXU {key[0]} holds shape "
                         f"{cur.shape}, popped as {p['shape']}")
    del st["acc"][key]
    return [cur.astype(p["dtype"])]


INTERPRET_RULES = {
    matmul_push_rhs_p: _push_rule,
    matmul_acc_lhs_p: _acc_rule,
    matmul_pop_p: _pop_rule,
}
