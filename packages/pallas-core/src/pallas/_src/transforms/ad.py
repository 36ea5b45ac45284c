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
data-dependent trip count, for instance). Without ``interpret=True`` the transpose is
emitted as backward kernels of the call's backend where it can be
(:mod:`pallas._src.transforms.backward`), and otherwise that expansion runs as XLA ops
for the call's platform, announced once per kernel (``pl.grad_fallback``).
"""

from __future__ import annotations

import dataclasses
import functools
import weakref

import jax
import jax.numpy as jnp

from pallas._src import jax_compat as jc
from pallas._src.config import grad_fallback
from pallas._src.dynamic_grid import refuse_dynamic_grid
from pallas._src.interpreter.grid_runner import interpret_pallas_call
from pallas._src.jaxpr_util import split_list
from pallas._src.pallas_call import pallas_call_p
from pallas._src.transforms import backward
from pallas._src.transforms.backward_common import JvpLayout
from pallas._src.transforms.backward_pruning import NotKernelizable
from pallas._src.transforms.effects import call_effects
from pallas._src.transforms.kernel_facts import is_interpreted, written_refs

# (The JVP rules of the kernel-side primitives a kernel jaxpr may contain are beside
# their definitions, in ``pallas._src.primitives``.)


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


def jvp_call(jaxpr, gm, nz_in, out_avals) -> JvpCall:
    """The JVP call of a ``pallas_call`` whose inputs have tangents where ``nz_in``."""
    key = (tuple(nz_in), tuple(out_avals))
    per_gm = _jvp_cache.setdefault(jaxpr, {})  # then by the grid mapping itself (by
    hit = per_gm.get((gm, key))                 # identity), never by its id
    if hit is not None:
        return hit
    if gm.grid_names is not None:  # the kernel may call lax.axis_index(name)
        with jc.extend_axis_env_nd([(n, s) for n, s in zip(gm.grid_names, gm.grid)]):
            result = _build_jvp_call(jaxpr, gm, list(nz_in), out_avals)
    else:
        result = _build_jvp_call(jaxpr, gm, list(nz_in), out_avals)
    per_gm[(gm, key)] = result
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
    written = written_refs(jaxpr.jaxpr)
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
    p_pf, p_in, p_out, p_scr = split_list(primal_avals, bounds)
    t_in, t_out, t_scr = split_list(tangent_avals, [n_tin, n_tin + n_tout])
    new_avals = [*p_pf, *p_in, *t_in, *p_out, *t_out, *p_scr, *t_scr]
    nb = [len(p_pf), len(p_in), len(t_in), len(p_out), len(t_out), len(p_scr)]
    new_bounds = [sum(nb[: k + 1]) for k in range(len(nb))]

    def kernel(*refs):
        pf, ins, tins, outs, touts, scr, tscr = split_list(refs, new_bounds)
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


def _positions(mask):
    pos, k = {}, 0
    for i, m in enumerate(mask):
        if m:
            pos[i] = k
            k += 1
    return pos


@dataclasses.dataclass(frozen=True)
class _JvpOrigin:
    """What partial evaluation needs to split a JVP call into primal and tangent parts."""

    params: dict  # the params of the primal-only call
    n_in: int  # operands that are primals (scalar prefetch + inputs)
    n_out: int  # outputs that are primals


# JVP call's grid mapping (compared by identity) -> its origin.
_jvp_origins: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _bind_jvp_call(jc_call: JvpCall, primals, tangents, params):
    """Binds the JVP call; returns (primal outputs, tangent outputs per output or Zero)."""
    nsp = params["grid_mapping"].num_scalar_prefetch
    t_in = [jc.instantiate_zeros(t) for t, m in zip(tangents[nsp:], jc_call.tin) if m]
    new_params = dict(params, jaxpr=jc_call.jaxpr, grid_mapping=jc_call.grid_mapping,
                      out_avals=jc_call.out_avals, checks=None, cost_estimate=None)
    if jc_call.grid_mapping not in _jvp_origins:
        _jvp_origins[jc_call.grid_mapping] = _JvpOrigin(
            dict(params, checks=None), len(primals), len(jc_call.tout))
    outs = pallas_call_p.bind(*primals, *t_in, **new_params)
    nout = len(jc_call.tout)
    p_out, t_outs = outs[:nout], iter(outs[nout:])
    t_out = [next(t_outs) if m else jc.Zero(jax.typeof(p).to_tangent_aval())
             for p, m in zip(p_out, jc_call.tout)]
    return list(p_out), t_out


def _nonzero_inputs(tangents, nsp):
    return [type(t) is not jc.Zero for t in tangents[nsp:]]


def _jvp_rule(primals, tangents, **params):
    refuse_dynamic_grid(params, "Differentiation (jax.jvp)")
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


class GradFallbackWarning(UserWarning):
    """The backward pass of a compiled ``pallas_call`` runs as XLA ops, not as kernels."""


# Kernels already warned about (by name), so the warning comes once per kernel.
_warned: set[str] = set()


def _xla_fallback(params, why: str) -> None:
    """Allows, warns about or refuses (see ``pl.grad_fallback``) running the backward pass
    of a compiled call as the XLA expansion of its interpreter semantics."""
    if is_interpreted(params):
        return  # the interpreter's expansion is the call itself: nothing falls back
    mode = grad_fallback.value
    where = (f"the backward pass of pallas_call {params['name']!r} cannot be emitted as "
             f"kernels ({why})")
    if mode == "error":
        raise NotImplementedError(
            f"Reverse-mode differentiation (jax.grad / jax.vjp): {where}, and "
            f"pl.grad_fallback is 'error' (environment: PALLAS_GRAD_FALLBACK). Allow the "
            f"XLA fallback with pl.grad_fallback('warn'), write the backward kernel with "
            f"jax.custom_vjp, or run the call with interpret=True."
        )
    if mode == "warn" and params["name"] not in _warned:
        import warnings

        _warned.add(params["name"])
        warnings.warn(
            f"{where}: it runs as XLA ops instead (the interpreter's expansion of the "
            f"kernel, differentiated by JAX): correct, but slower than a kernel. "
            f"pl.grad_fallback('allow') silences this, pl.grad_fallback('error') makes "
            f"it an error.", GradFallbackWarning, stacklevel=2)


def _linearize_rule(is_vjp, nzs, *primals, **params):
    refuse_dynamic_grid(params, "Differentiation (jax.grad / jax.vjp / jax.linearize)")
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


def _transpose_values(*vals, lin, **params):
    """Cotangents of a linear pallas_call's operands marked in ``lin`` (plain JAX).

    ``vals`` are the non-linear operands followed by one cotangent per output.
    """
    jaxpr, gm = params["jaxpr"], params["grid_mapping"]
    n_known = len(lin) - sum(lin)
    known_vals, cts = vals[:n_known], vals[n_known:]
    lin_avals = [bm.array_aval for bm, m in zip(_operand_avals(gm), lin) if m]
    known_it = iter(known_vals)
    known = [None if m else next(known_it) for m in lin]

    def f(*lin_vals):
        it = iter(lin_vals)
        full = [next(it) if m else k for k, m in zip(known, lin)]
        return interpret_pallas_call(*full, jaxpr=jaxpr, grid_mapping=gm)

    zeros = [jnp.zeros(a.shape, a.dtype) for a in lin_avals]
    outs, vjp = jax.vjp(f, *zeros)
    cts = [_ct_like(ct, o) for ct, o in zip(cts, outs)]
    return list(vjp(cts))


class _OperandAval:
    def __init__(self, aval):
        self.array_aval = aval


def _operand_avals(gm):
    return [*(_OperandAval(a) for a in gm.prefetch_avals), *gm.in_block_mappings]


def _transpose_rule(cts, *args, **params):
    lin = tuple(jc.is_undefined_primal(a) for a in args)
    if not params["interpret"]:
        ct_lin = _transpose_as_kernels(cts, args, params)
        if ct_lin is not None:
            ct_it = iter(ct_lin)
            return [next(ct_it) if m else None for m in lin]
    known = [a for a, m in zip(args, lin) if not m]
    n_out = len(params["out_avals"])
    cts = [jc.instantiate_zeros(ct) for ct in cts[:n_out]]
    lin_avals = [a.aval for a, m in zip(args, lin) if m]
    vma = frozenset().union(*(_varying(jax.typeof(x)) for x in [*known, *cts]),
                            *(_varying(a) for a in lin_avals))
    if vma:
        # Inside shard_map: operands vary over manual mesh axes but the interpreter's
        # own constants do not, so the expansion is kept out of the shard_map trace and
        # expanded at lowering time on plain (per-instance) types.
        ct_lin = pallas_call_transpose_p.bind(*known, *cts, lin=lin, **params)
    else:
        ct_lin = _transpose_values(*known, *cts, lin=lin, **params)
    ct_it = iter(ct_lin)
    return [next(ct_it) if m else None for m in lin]


def _transpose_as_kernels(cts, args, params):
    """The cotangents of the linear operands computed by backward ``pallas_call``s of
    the call's backend, or ``None`` after announcing the XLA fallback (see
    :mod:`pallas._src.transforms.backward`)."""
    gm = params["grid_mapping"]
    origin = _jvp_origins.get(gm)
    try:
        if origin is None:
            raise NotKernelizable("it is not the JVP call of a kernel")
        pgm = origin.params["grid_mapping"]
        layout = JvpLayout(
            n_prefetch=gm.num_scalar_prefetch, n_primal_in=pgm.num_inputs,
            n_tangent_in=gm.num_inputs - pgm.num_inputs, n_primal_out=origin.n_out,
            n_tangent_out=gm.num_outputs - origin.n_out, n_scratch=pgm.num_scratch,
            n_tangent_scratch=gm.num_scratch - pgm.num_scratch)
        lin = [jc.is_undefined_primal(a) for a in args]
        n_known = layout.n_prefetch + layout.n_primal_in
        if lin != [False] * n_known + [True] * (len(args) - n_known):
            raise NotKernelizable("a primal operand is itself linear")
        return backward.transpose_as_kernels(cts, args, params, layout, origin.params)
    except NotKernelizable as e:
        _xla_fallback(params, str(e))
        return None


def _varying(aval) -> frozenset:
    mat = getattr(aval, "manual_axis_type", None)
    return frozenset() if mat is None else mat.varying


def _ct_like(ct, out):
    aval = jax.typeof(out).to_tangent_aval()
    if ct.dtype != aval.dtype:
        return jnp.zeros(aval.shape, aval.dtype)
    return ct


# The transposed call as a primitive of its own (used inside shard_map, see above).
pallas_call_transpose_p = jc.Primitive("pallas_call_transpose")
pallas_call_transpose_p.multiple_results = True


def _transpose_abstract_eval(*avals, lin, grid_mapping, **params):
    vma = frozenset().union(*(_varying(a) for a in avals))
    outs = [bm.array_aval for bm, m in zip(_operand_avals(grid_mapping), lin) if m]
    if not vma:
        return [jc.ShapedArray(a.shape, a.dtype) for a in outs]
    mat = jc.core.ManualAxisType(varying=vma)
    return [jc.ShapedArray(a.shape, a.dtype, sharding=jc.core.get_cur_mesh_sharding(),
                           manual_axis_type=mat) for a in outs]


def _transpose_lowering(ctx, *nodes, **params):
    fun = functools.partial(_transpose_values, **params)
    plain = ctx.replace(avals_in=[jc.ShapedArray(a.shape, a.dtype) for a in ctx.avals_in],
                        avals_out=[jc.ShapedArray(a.shape, a.dtype) for a in ctx.avals_out])
    return jc.mlir.lower_fun(fun, multiple_results=True)(plain, *nodes)


def _transpose_batching(args, dims, **params):
    fun = functools.partial(_transpose_values, **params)
    outs = jax.vmap(fun, in_axes=tuple(dims), out_axes=0)(*args)
    return outs, [0] * len(outs)


pallas_call_transpose_p.def_abstract_eval(_transpose_abstract_eval)
pallas_call_transpose_p.def_impl(
    lambda *a, **p: jc.dispatch_apply_primitive(pallas_call_transpose_p, *a, **p))
jc.mlir.register_lowering(pallas_call_transpose_p, _transpose_lowering)
jc.primitive_batchers[pallas_call_transpose_p] = _transpose_batching


jc.primitive_transposes[pallas_call_p] = _transpose_rule


# ------------------------------------------------------------------------------------
# Partial evaluation: a JVP call with known primals and unknown tangents splits into a
# known primal call and a staged JVP call (whose primal outputs are dropped). This is
# what lets jax.checkpoint, lax.scan and lax.cond bodies containing pallas_calls be
# differentiated in reverse mode.


def _split_origin(params, known):
    origin = _jvp_origins.get(params["grid_mapping"])
    if origin is None or all(known) or not all(known[: origin.n_in]):
        return None
    return origin


def _partial_eval_rule(trace, *tracers, **params):
    known = [t.pval.is_known() for t in tracers]
    origin = _split_origin(params, known)
    if origin is None:
        return trace.default_process_primitive(pallas_call_p, tracers, params)
    primal_vals = [t.pval.get_known() for t in tracers[: origin.n_in]]
    p_out = pallas_call_p.bind(*primal_vals, **origin.params)
    staged = trace.default_process_primitive(pallas_call_p, tracers, params)
    return [*p_out, *staged[origin.n_out :]]


def _partial_eval_custom_rule(saveable, unks_in, inst_in, eqn):
    n = len(eqn.outvars)
    origin = _split_origin(eqn.params, [not u for u in unks_in])
    if origin is None:  # what JAX does for a primitive without a rule
        res = [v for v, u, i in zip(eqn.invars, unks_in, inst_in)
               if isinstance(v, jc.Var) and not u and not i]
        if any(unks_in):
            return None, eqn, [True] * n, [True] * n, res
        policy = jc.pe.ensure_enum(saveable(eqn.primitive, *[v.aval for v in eqn.invars],
                                            **eqn.params))
        if eqn.effects or not isinstance(policy, jc.pe.RecomputeType):
            return eqn, None, [False] * n, [False] * n, []
        return eqn, eqn, [False] * n, [True] * n, res
    k, m = origin.n_in, origin.n_out
    known_eqn = eqn.replace(invars=eqn.invars[:k], outvars=eqn.outvars[:m],
                            params=origin.params,
                            effects=call_effects(origin.params["jaxpr"].jaxpr,
                                                 origin.params["grid_mapping"].grid_names))
    staged_eqn = eqn.replace(
        outvars=[jc.core.DropVar(v.aval) for v in eqn.outvars[:m]] + eqn.outvars[m:])
    res = [v for v, i in zip(eqn.invars[:k], inst_in[:k])
           if isinstance(v, jc.Var) and not i]
    unks_out = [False] * m + [True] * (n - m)
    return known_eqn, staged_eqn, unks_out, list(unks_out), res


jc.pe.custom_partial_eval_rules[pallas_call_p] = _partial_eval_rule
jc.pe.partial_eval_jaxpr_custom_rules[pallas_call_p] = _partial_eval_custom_rule
