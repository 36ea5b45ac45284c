"""Automatic differentiation of ``pallas_call_p``: JVP, linearization and transposition.

**JVP** (``jax.jvp``, forward mode, every backend): one ``pallas_call`` over primals and
tangents. The kernel jaxpr is differentiated with JAX's own JVP of stateful jaxprs
(``get``/``swap``/``addupdate`` carry a ref's tangent in a tangent ref), so each primal
ref gets a tangent ref with the same block mapping. The new kernel's refs are ordered
``[prefetch, ins, tangent ins, outs, tangent outs, scratch, tangent scratch]``. Inputs
that are not differentiable (integers) or whose tangent is a symbolic zero get no
tangent ref; every floating output and scratch buffer gets one.

**grad** (``jax.grad``/``jax.vjp``, reverse mode) needs the tangent part transposed.
JAX linearizes a primitive with the rule registered here:

- the primal outputs come from the original call (known values, no tangents);
- the tangent outputs come from the JVP call, with the primal operands as residuals.
  That call is linear in its tangent operands.

Its transpose rule differentiates the interpreter's expansion of the call (plain JAX)
with ``jax.vjp`` with respect to the tangent operands, so ``grad`` works for any kernel
whose interpreter expansion JAX can reverse-differentiate (no ``while_loop`` with a
data-dependent trip count, for instance). This needs ``interpret=True``: for compiled
backends linearization raises, pointing at ``jax.custom_vjp``.
"""

from __future__ import annotations

import dataclasses
import weakref

import jax
import jax.numpy as jnp

from pallas._src import jax_compat as jc
from pallas._src.pallas_call import pallas_call_p
from pallas._src.primitives import load_store
from pallas._src.primitives.hints import multiple_of_p

# ------------------------------------------------------------------------------------
# JVP rules of the kernel-side primitives that the kernel jaxpr may contain.


def _masked_load_jvp(primals, tangents, *, tree, has_mask, has_other):
    ref, *rest = primals
    tref = tangents[0]
    out = load_store.load_p.bind(ref, *rest, tree=tree, has_mask=has_mask,
                                 has_other=has_other)
    t_aval = jax.typeof(out).to_tangent_aval()
    if type(tref) is jc.Zero:
        return out, jc.Zero(t_aval)
    trest = list(rest)
    if has_other:
        trest[-1] = jc.instantiate_zeros(tangents[-1])
    tout = load_store.load_p.bind(tref, *trest, tree=tree, has_mask=has_mask,
                                  has_other=has_other)
    return out, tout


def _masked_swap_jvp(primals, tangents, *, tree, has_mask):
    ref, val, *rest = primals
    tref, tval = tangents[0], tangents[1]
    out = load_store.swap_p.bind(ref, val, *rest, tree=tree, has_mask=has_mask)
    t_aval = jax.typeof(out).to_tangent_aval()
    if type(tref) is jc.Zero and type(tval) is jc.Zero:
        return out, jc.Zero(t_aval)
    if type(tref) is jc.Zero:
        raise ValueError(
            "A differentiated value is stored into a kernel ref that has no tangent "
            f"({jax.typeof(ref).str_short()})."
        )
    tout = load_store.swap_p.bind(tref, jc.instantiate_zeros(tval), *rest, tree=tree,
                                  has_mask=has_mask)
    return out, tout


def _multiple_of_jvp(primals, tangents, *, values):
    return multiple_of_p.bind(primals[0], values=values), tangents[0]


jc.primitive_jvps[load_store.load_p] = _masked_load_jvp
jc.primitive_jvps[load_store.swap_p] = _masked_swap_jvp
jc.primitive_jvps[multiple_of_p] = _multiple_of_jvp


# ------------------------------------------------------------------------------------
# The JVP kernel.


def _differentiable(aval) -> bool:
    return jnp.issubdtype(aval.dtype, jnp.inexact)


@dataclasses.dataclass(frozen=True)
class JvpCall:
    """The JVP ``pallas_call`` of a call: its kernel, grid mapping and which refs have
    tangents (``tin``: per input, ``tout``: per output, ``tscratch``: per scratch)."""

    jaxpr: object
    grid_mapping: object
    tin: tuple
    tout: tuple
    tscratch: tuple
    out_avals: tuple

    @property
    def num_tangent_outputs(self) -> int:
        return sum(self.tout)


# Derived calls are cached per (kernel jaxpr, grid mapping, tangent pattern); both are
# compared by identity, as the primitive's params are.
_jvp_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _write_refs(jaxpr) -> set[int]:
    """Indices of the kernel invars that the kernel writes (or accumulates into)."""
    pos = {v: k for k, v in enumerate(jaxpr.invars)}
    out = set()
    for e in jaxpr.effects:
        if isinstance(e, (jc.WriteEffect, jc.AccumEffect)):
            k = e.input if isinstance(e.input, int) else pos.get(e.input)
            if k is not None:
                out.add(k)
    return out


def jvp_call(jaxpr, gm, nz_in, out_avals) -> JvpCall:
    """The JVP call of a ``pallas_call`` whose inputs have tangents where ``nz_in``."""
    key = (tuple(nz_in), tuple(out_avals))
    per_gm = _jvp_cache.setdefault(jaxpr, {})
    hit = per_gm.get((id(gm), key))
    if hit is not None and hit[0] is gm:
        return hit[1]
    result = _build_jvp_call(jaxpr, gm, list(nz_in), out_avals)
    per_gm[(id(gm), key)] = (gm, result)
    return result


def _build_jvp_call(jaxpr, gm, nz_in, out_avals) -> JvpCall:
    nsp, nin, nout = gm.num_scalar_prefetch, gm.num_inputs, gm.num_outputs
    in_bms, out_bms = gm.in_block_mappings, gm.out_block_mappings
    tin = [nz and _differentiable(bm.array_aval) for nz, bm in zip(nz_in, in_bms)]
    tout = [_differentiable(bm.array_aval) for bm in out_bms]
    tscratch = [_differentiable(t.inner_aval) for t in gm.scratch_types]
    for i, o in gm.input_output_aliases:
        if i >= nsp and tout[o] and _differentiable(in_bms[i - nsp].array_aval):
            tin[i - nsp] = True  # the tangent output starts as the input's tangent
    written = _write_refs(jaxpr.jaxpr)
    for k in range(nin):
        if nsp + k in written and _differentiable(in_bms[k].array_aval):
            tin[k] = True  # a kernel that writes into an input ref needs its tangent

    nonzeros = [False] * nsp + tin + tout + tscratch
    jvp, _ = jc.jvp_jaxpr(jaxpr, nonzeros, instantiate=False)
    jvp_avals = [v.aval for v in jvp.jaxpr.invars]
    n_primal = len(nonzeros)
    primal_avals, tangent_avals = jvp_avals[:n_primal], jvp_avals[n_primal:]
    n_tin, n_tout = sum(tin), sum(tout)
    bounds = [nsp, nsp + nin, nsp + nin + nout]
    p_pf, p_in, p_out, p_scr = _split(primal_avals, bounds)
    t_in, t_out, t_scr = _split(tangent_avals, [n_tin, n_tin + n_tout])
    new_avals = [*p_pf, *p_in, *t_in, *p_out, *t_out, *p_scr, *t_scr]
    nb = [len(p_pf), len(p_in), len(t_in), len(p_out), len(t_out), len(p_scr)]
    new_bounds = [sum(nb[: k + 1]) for k in range(len(nb))]

    def kernel(*refs):
        pf, ins, tins, outs, touts, scr, tscr = _split(refs, new_bounds)
        jc.core.eval_jaxpr(jvp.jaxpr, jvp.consts, *pf, *ins, *outs, *scr, *tins, *touts,
                           *tscr)
        return []

    new_jaxpr, _, consts = jc.trace_kernel_to_jaxpr(kernel, new_avals, "jvp kernel")
    new_closed = jc.ClosedJaxpr(new_jaxpr, consts)

    def tangent_bm(bm):
        return dataclasses.replace(
            bm, origin=f"tangent of {bm.origin}",
            array_aval=bm.array_aval.update(dtype=bm.array_aval.to_tangent_aval().dtype),
        )

    t_in_bms = [tangent_bm(bm) for bm, t in zip(in_bms, tin) if t]
    t_out_bms = [tangent_bm(bm) for bm, t in zip(out_bms, tout) if t]
    t_scratch = [t for t, nz in zip(gm.scratch_types, tscratch) if nz]
    t_scratch_origins = [f"tangent of {o}" for o, nz in zip(gm.scratch_origins, tscratch)
                         if nz]
    tin_pos = _positions(tin)
    tout_pos = _positions(tout)
    aliases = list(gm.input_output_aliases)
    for i, o in gm.input_output_aliases:
        if i >= nsp and tin[i - nsp] and tout[o]:
            aliases.append((nsp + nin + tin_pos[i - nsp], nout + tout_pos[o]))
    new_gm = dataclasses.replace(
        gm,
        block_mappings=(*in_bms, *t_in_bms, *out_bms, *t_out_bms),
        num_inputs=nin + n_tin,
        num_outputs=nout + n_tout,
        scratch_types=(*gm.scratch_types, *t_scratch),
        scratch_origins=(*gm.scratch_origins, *t_scratch_origins),
        input_output_aliases=tuple(aliases),
    )
    t_out_avals = [a.update(dtype=a.to_tangent_aval().dtype)
                   for a, t in zip(out_avals, tout) if t]
    return JvpCall(new_closed, new_gm, tuple(tin), tuple(tout), tuple(tscratch),
                   (*out_avals, *t_out_avals))


def _split(xs, bounds):
    xs = list(xs)
    out, lo = [], 0
    for b in bounds:
        out.append(xs[lo:b])
        lo = b
    out.append(xs[lo:])
    return out


def _positions(mask):
    pos, k = {}, 0
    for i, m in enumerate(mask):
        if m:
            pos[i] = k
            k += 1
    return pos


def _bind_jvp_call(jc_call: JvpCall, primals, tangents, params):
    """Binds the JVP call; returns (primal outputs, tangent outputs per output or Zero)."""
    nsp = params["grid_mapping"].num_scalar_prefetch
    t_in = [jc.instantiate_zeros(t) for t, m in zip(tangents[nsp:], jc_call.tin) if m]
    new_params = dict(params, jaxpr=jc_call.jaxpr, grid_mapping=jc_call.grid_mapping,
                      out_avals=jc_call.out_avals, checks=None, cost_estimate=None)
    outs = pallas_call_p.bind(*primals, *t_in, **new_params)
    nout = len(jc_call.tout)
    p_out, t_outs = outs[:nout], iter(outs[nout:])
    t_out = [next(t_outs) if m else jc.Zero(jax.typeof(p).to_tangent_aval())
             for p, m in zip(p_out, jc_call.tout)]
    return list(p_out), t_out


def _nonzero_inputs(tangents, nsp):
    return [type(t) is not jc.Zero for t in tangents[nsp:]]


def _jvp_rule(primals, tangents, **params):
    gm, checks = params["grid_mapping"], params["checks"]
    nsp = gm.num_scalar_prefetch
    call = jvp_call(params["jaxpr"], gm, _nonzero_inputs(tangents, nsp), params["out_avals"])
    p_out, t_out = _bind_jvp_call(call, primals, tangents, params)
    if checks is not None and checks.any:
        # The interpreter's error vector is decoded against the original kernel, so the
        # checked primal call runs as well (its outputs are the primal outputs).
        checked = pallas_call_p.bind(*primals, **params)
        err = checked[-1]
        return [*checked[:-1], err], [*t_out, jc.Zero(jax.typeof(err).to_tangent_aval())]
    return p_out, t_out


jc.primitive_jvps[pallas_call_p] = _jvp_rule


# ------------------------------------------------------------------------------------
# Linearization (what jax.grad / jax.vjp / jax.linearize use) and transposition.


def _require_interpret(params, what: str):
    if not params["interpret"]:
        raise NotImplementedError(
            f"{what} of pallas_call {params['name']!r} with a compiled backend is not "
            f"supported: pallas-core can transpose a kernel only through the "
            f"interpreter. Use jax.custom_vjp with a backward kernel, or run the call "
            f"with interpret=True. (Forward mode, jax.jvp, works on every backend.)"
        )


def _linearize_rule(is_vjp, nzs, *primals, **params):
    _require_interpret(params, "Reverse-mode differentiation (jax.grad / jax.vjp)")
    gm = params["grid_mapping"]
    nsp = gm.num_scalar_prefetch
    nz_in = list(nzs[nsp:])
    call = jvp_call(params["jaxpr"], gm, nz_in, params["out_avals"])
    primal_out = pallas_call_p.bind(*primals, **params)
    checks = params["checks"]
    has_err = checks is not None and checks.any
    tangent_nzs_out = [*call.tout] + ([False] if has_err else [])
    out_avals = [jax.typeof(p) for p in primal_out]

    def linearized(residuals, *tangents):
        _, t_out = _bind_jvp_call(call, residuals, tangents, params)
        if has_err:
            t_out.append(jc.Zero(out_avals[-1].to_tangent_aval()))
        return t_out

    return list(primal_out), tangent_nzs_out, list(primals), linearized


jc.primitive_linearizations[pallas_call_p] = _linearize_rule


def _transpose_rule(cts, *args, **params):
    _require_interpret(params, "Transposition")
    from pallas._src.interpreter.grid_runner import interpret_pallas_call

    jaxpr, gm = params["jaxpr"], params["grid_mapping"]
    lin = [jc.is_undefined_primal(a) for a in args]
    known = [None if m else a for a, m in zip(args, lin)]
    lin_avals = [a.aval for a, m in zip(args, lin) if m]

    def f(*lin_vals):
        it = iter(lin_vals)
        full = [next(it) if m else k for k, m in zip(known, lin)]
        return interpret_pallas_call(*full, jaxpr=jaxpr, grid_mapping=gm)

    zeros = [jnp.zeros(a.shape, a.dtype) for a in lin_avals]
    outs, vjp = jax.vjp(f, *zeros)
    cts = [jc.instantiate_zeros(ct) if type(ct) is jc.Zero
           else ct for ct in cts[: len(outs)]]
    cts = [_ct_like(ct, o) for ct, o in zip(cts, outs)]
    ct_lin = iter(vjp(cts))
    return [next(ct_lin) if m else None for m in lin]


def _ct_like(ct, out):
    aval = jax.typeof(out).to_tangent_aval()
    if ct.dtype != aval.dtype:
        return jnp.zeros(aval.shape, aval.dtype)
    return ct


jc.primitive_transposes[pallas_call_p] = _transpose_rule
