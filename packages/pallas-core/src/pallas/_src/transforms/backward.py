"""Reverse mode as kernels: the transpose of a JVP ``pallas_call`` as backward calls.

The JVP call of a kernel (see :mod:`pallas._src.transforms.ad`) is linear in its tangent
refs. Its transpose is built here as ordinary ``pallas_call``s, so that the backward
pass lowers through the same backend as the forward pass. For each tangent input ``n``:

- the kernel body is the JVP kernel, partially evaluated into its primal part (run
  first, saving the residuals) and its linear part, which JAX transposes
  (``ad.backward_pass3``) with respect to the tangent refs: reads of a tangent input
  become accumulations into the cotangent of input ``n``, writes of a tangent output
  become reads of its cotangent;
- its only output is the cotangent of input ``n``, tiled like input ``n``;
- the grid is reordered so that the axes input ``n``'s index map does not use come
  last: every program that adds into one cotangent block runs consecutively, the block
  is zeroed on the first of them and stays resident until the last (the accumulator
  pattern every backend supports: Triton loops over such axes inside the program, TPU
  keeps the block in VMEM). ``dimension_semantics`` in the compiler params, where the
  backend has them, are reordered with the grid and those axes made ``"arbitrary"``.

Kernels that carry state from one grid step to the next (scratch read before it is
written, an output block revisited other than by zero-init-then-accumulate) get a
state sweep first (:mod:`pallas._src.transforms.backward_carried`).

What is not emitted as kernels raises :class:`NotKernelizable` with the reason, and the
caller falls back to the XLA expansion: aliased operands, kernels that write their
inputs, index maps that are not plain block indices (or read scalar prefetch), outputs
revisited non-consecutively, backward bodies that read a primal output, anything JAX
cannot transpose inside a kernel, and backward kernels the call's backend refuses in
its ``validate``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas._src import jax_compat as jc
from pallas._src.memory import MemoryRef
from pallas._src.pallas_call import pallas_call_p
from pallas._src.primitives import control
from pallas._src.primitives.grid import program_id
from pallas._src.transforms.ad import _write_refs
from pallas._src.transforms.backward_pruning import NotKernelizable, drop_dead_locals
from pallas._src.transforms.backward_replay import zeros_for_empty
from pallas._src.transforms.grid_axes import remap_grid_axes


@dataclasses.dataclass(frozen=True)
class JvpLayout:
    """Where the primal and tangent operands of a JVP call are (counts per group)."""

    n_prefetch: int
    n_primal_in: int
    n_tangent_in: int
    n_primal_out: int
    n_tangent_out: int
    n_scratch: int
    n_tangent_scratch: int


class _KernelRefAccum(jc.ad.RefAccum):
    """A cotangent accumulator that is a ref of the backward kernel itself."""

    def __init__(self, ref):
        super().__init__(jax.typeof(ref).inner_aval.to_ct_aval(), ref)

    def accum(self, x):
        if x is None or isinstance(x, jc.Zero):
            return
        self.ref[...] = self.ref[...] + x

    def inst(self):
        return self


@contextlib.contextmanager
def _constant_stores_transpose():
    """Lets JAX transpose a store of a non-linear value (``to[...] = zeros``) into a
    linear ref, which kernels do to initialise accumulators: the cotangent of the ref's
    old contents is written back (zero when the old value is unused) and the stored
    constant gets none. JAX's own rule expects the stored value to be linear too; it is
    used unchanged for every other store, and restored on exit."""
    table = jc.ad.fancy_transposes
    orig = table[jc.swap_p]

    def rule(g, ref_, x, *idx, **params):
        if not isinstance(ref_, jc.ad.GradAccum):
            if isinstance(x, jc.ad.GradAccum):
                return None  # a primal result (of a loop's JVP) into a primal buffer
            return orig(g, ref_, x, *idx, **params)
        if isinstance(x, jc.ad.GradAccum):
            return orig(g, ref_, x, *idx, **params)
        if ref_.ref is not None:
            jc.swap_p.bind(ref_.inst().ref, jc.instantiate_zeros(g), *idx, **params)
        return None

    table[jc.swap_p] = rule
    try:
        yield
    finally:
        table[jc.swap_p] = orig


def transpose_as_kernels(cts, args, params, layout: JvpLayout, primal_params=None) -> list:
    """Cotangents of the tangent inputs of a JVP call, computed by backward calls.

    ``args`` are the call's operands (the tangent inputs undefined), ``cts`` one
    cotangent per output, ``primal_params`` the params of the forward call (needed when
    the kernel carries state between grid steps, see
    :mod:`pallas._src.transforms.backward_carried`). Raises :class:`NotKernelizable`
    when it cannot.
    """
    from pallas._src.transforms import backward_carried

    gm, closed = params["grid_mapping"], params["jaxpr"]
    L = layout
    if gm.input_output_aliases:
        raise NotKernelizable("the call aliases inputs to outputs")
    if any(type(ct) is not jc.Zero for ct in cts[: L.n_primal_out]):
        raise NotKernelizable("cotangents flow into the primal outputs of the JVP call")
    written = _write_refs(closed.jaxpr)
    first_tin = L.n_prefetch + L.n_primal_in
    if any(first_tin <= k < first_tin + L.n_tangent_in for k in written):
        raise NotKernelizable("the kernel writes into an input ref")
    tout_bms = gm.out_block_mappings[L.n_primal_out:]
    known = [a for a in args[: L.n_prefetch + L.n_primal_in]]
    ct_touts = [jc.instantiate_zeros(ct) if type(ct) is not jc.Zero
                else jnp.zeros(bm.array_aval.shape, bm.array_aval.dtype)
                for ct, bm in zip(cts[L.n_primal_out:], tout_bms)]
    carried = backward_carried.analyse(closed, L, gm)
    if carried is not None:
        return backward_carried.transpose_carried(ct_touts, known, params, L, carried,
                                                  primal_params)
    if L.n_tangent_scratch and _scratch_carried(closed, L, gm.grid):
        raise NotKernelizable("the kernel carries differentiable scratch state")
    ng = len(gm.grid)
    for k, bm in enumerate(tout_bms):
        if not _plain_index_map(bm, ng) or not all(_axes_used(bm, ng)):
            ref = closed.jaxpr.invars[first_tin + L.n_tangent_in + L.n_primal_out + k]
            why = _accumulate_only(closed.jaxpr, ref)
            if why:
                raise NotKernelizable(f"tangent output {bm.origin} is revisited along "
                                      f"a grid axis and {why}")
    return [_backward_call(n, known, ct_touts, params, layout)
            for n in range(L.n_tangent_in)]


def _scratch_carried(closed, L: JvpLayout, grid) -> bool:
    """Whether some scratch buffer may be read before it is written in a program (its
    value then comes from the previous grid step). Scratch that every program writes
    first is program-local: its cotangent starts at zero in each backward program."""
    from pallas._src.interpreter import analysis

    first = (L.n_prefetch + L.n_primal_in + L.n_tangent_in + L.n_primal_out
             + L.n_tangent_out)
    return analysis.scratch_live_in(closed.jaxpr, first, {}, grid)


def _backward_call(n, known, ct_touts, params, L: JvpLayout):
    gm, closed = params["grid_mapping"], params["jaxpr"]
    ng = len(gm.grid)
    bm_n = gm.in_block_mappings[L.n_primal_in + n]
    if not _plain_index_map(bm_n, ng):
        raise NotKernelizable(f"the index map of {bm_n.origin} is not a plain block index")
    used = _axes_used(bm_n, ng)
    outer = [a for a in range(ng) if used[a]]
    inner = [a for a in range(ng) if not used[a]]
    perm = outer + inner  # new position p holds original axis perm[p]
    pos = {a: p for p, a in enumerate(perm)}
    grid = tuple(gm.grid[a] for a in perm)
    names = None if gm.grid_names is None else tuple(gm.grid_names[a] for a in perm)

    nsp, npi = L.n_prefetch, L.n_primal_in
    pin_bms = [_permuted(bm, perm) for bm in gm.in_block_mappings[:npi]]
    tout_bms = gm.out_block_mappings[L.n_primal_out:]
    ctt_bms = [_permuted(bm, perm, origin=f"cotangent of {bm.origin}") for bm in tout_bms]
    ctn_bm = _permuted(bm_n, perm, origin=f"cotangent of {bm_n.origin}")
    pout_bms = gm.out_block_mappings[: L.n_primal_out]
    # primal scratch, then one cotangent buffer per (program-local) tangent scratch
    scr0 = list(gm.scratch_types)
    local = ([MemoryRef(jc.ShapedArray(bm.ref_shape, bm.array_aval.dtype),
                        bm.memory_space) for bm in pout_bms]
             + [MemoryRef(jc.ShapedArray(bm.ref_shape, bm.array_aval.dtype),
                          bm.memory_space) for bm in tout_bms]
             + [MemoryRef(jc.ShapedArray(bm.ref_shape, bm.array_aval.dtype),
                          bm.memory_space)
                for j, bm in enumerate(gm.in_block_mappings[npi:]) if j != n])
    pf_avals = [jc.AbstractRef(a, memory_space=None) for a in gm.prefetch_avals]
    avals = [*pf_avals, *(bm.ref_aval for bm in pin_bms), *(bm.ref_aval for bm in ctt_bms),
             ctn_bm.ref_aval, *(t.get_ref_aval() for t in scr0),
             *(t.get_ref_aval() for t in local)]
    jvp_jaxpr = remap_grid_axes(closed.jaxpr, pos.__getitem__)
    n_tout, n_tin = L.n_tangent_out, L.n_tangent_in
    primal_part, linear_part, n_res = _split_primal_and_linear(jvp_jaxpr, closed.consts, L)
    primal_part = zeros_for_empty(primal_part)
    bounds = _cumsum([nsp, npi, n_tout, 1, L.n_scratch, L.n_tangent_scratch,
                      L.n_primal_out, n_tout])

    def body(*refs):
        pf, pins, ctt, (ctn,), scr, ct_scr, pout, tloc, sinks = _split(refs, bounds)
        for r in ct_scr:
            _store_zeros(r)
        zero = functools.partial(_store_zeros, ctn)
        if inner:
            first = functools.reduce(jnp.logical_and,
                                     [program_id(pos[a]) == 0 for a in inner])
            control.when(first)(zero)
        else:
            zero()
        for loc, src in zip(tloc, ctt):
            loc[...] = src[...]
        sink_it = iter(sinks)
        tins = [ctn if j == n else next(sink_it) for j in range(n_tin)]
        known = [*closed.consts, *pf, *pins, *pout, *scr]
        residuals = jc.core.eval_jaxpr(primal_part, (), *known)[:n_res]
        env = [*residuals, *closed.consts, *pf, *pins, *map(_KernelRefAccum, tins), *pout,
               *map(_KernelRefAccum, tloc), *scr, *map(_KernelRefAccum, ct_scr)]
        with _constant_stores_transpose():
            jc.ad.backward_pass3(linear_part, False, (), env, [])
        return []

    what = f"backward kernel of {params['name']} for {bm_n.origin}"
    jaxpr, consts = trace_transposed_body(body, avals, what, names, grid)
    n_fixed = nsp + npi + n_tout + 1 + len(scr0)
    jaxpr, consts, keep = drop_dead_locals(jaxpr, consts, avals, n_fixed,
                                            L.n_primal_out, n_tout, what)
    new_gm = dataclasses.replace(
        gm, grid=grid, grid_names=names,
        block_mappings=(*pin_bms, *ctt_bms, ctn_bm),
        num_inputs=npi + n_tout, num_outputs=1,
        scratch_types=(*scr0, *(t for t, k in zip(local, keep) if k)),
        scratch_origins=(*gm.scratch_origins[: L.n_scratch],
                         *(f"cotangent of {o}" for o in gm.scratch_origins[L.n_scratch:]),
                         *(f"backward local {i}" for i, k in enumerate(keep) if k)),
        input_output_aliases=(),
    )
    out_aval = ctn_bm.array_aval
    new_jaxpr = jc.ClosedJaxpr(jaxpr, consts)
    new_params = _permuted_params(params["compiler_params"], perm, inner)
    _check_backend_accepts(params, new_jaxpr, new_gm, new_params)
    (ct,) = pallas_call_p.bind(
        *known, *ct_touts,
        **dict(params, jaxpr=new_jaxpr, grid_mapping=new_gm,
               out_avals=(out_aval,), checks=None, cost_estimate=None,
               name=f"{params['name']} (backward, {bm_n.origin})",
               compiler_params=new_params))
    return ct


def trace_transposed_body(body, avals, what: str, names, grid):
    """Traces a backward kernel's body (JAX's transpose of the JVP kernel) to a jaxpr and
    its consts, under the grid's named axes; whatever JAX cannot transpose inside a
    kernel is :class:`NotKernelizable` (the caller falls back to XLA)."""
    try:
        if names is not None:
            with jc.extend_axis_env_nd(list(zip(names, grid))):
                jaxpr, _, consts = jc.trace_kernel_to_jaxpr(body, avals, what)
        else:
            jaxpr, _, consts = jc.trace_kernel_to_jaxpr(body, avals, what)
    except NotKernelizable:
        raise
    except Exception as e:  # noqa: BLE001 - anything JAX cannot transpose in a kernel
        raise NotKernelizable(f"JAX cannot transpose the kernel body: "
                              f"{type(e).__name__}: {str(e).splitlines()[0]}") from e
    return jaxpr, consts


def target_backend(params):
    """The backend the call will run on (the one named by ``backend=`` or the compiler
    params, else the default platform's), or None when there is none to ask."""
    from pallas._src.registry import registry

    try:
        name = registry.requested_backend(params["backend"], params["compiler_params"])
        return (registry.get_backend(name) if name is not None else
                registry.select_backend(jax.default_backend(), None,
                                        params["compiler_params"]))
    except Exception:  # noqa: BLE001 - no backend to ask (e.g. none for this platform)
        return None


def _check_backend_accepts(params, jaxpr, gm, compiler_params) -> None:
    """Asks the backend the call will run on (the one named by ``backend=`` or the
    compiler params, else the default platform's) to validate the backward kernel, so
    one it cannot lower falls back to XLA instead of failing at lowering."""
    from pallas._src.registry import registry
    from pallas._src.registry.requests import KernelRequest

    b = target_backend(params)
    if b is None:
        return
    try:
        b.artifact(KernelRequest(
            jaxpr=jaxpr, grid_mapping=gm, name=params.get("name") or "kernel",
            compiler_params=registry.resolve_compiler_params(b, compiler_params)))
    except Exception as e:  # noqa: BLE001 - any refusal means: not as kernels
        raise NotKernelizable(f"backend {b.name!r} cannot lower the backward kernel: "
                              f"{type(e).__name__}: {str(e).splitlines()[0]}") from e


def _split_primal_and_linear(jvp_jaxpr, consts, L: JvpLayout, hoist=None):
    """Partial evaluation of the JVP kernel with its tangent refs unknown: the primal
    part (everything computable from primal refs, returning the residuals) and the
    linear part (residuals, then every ref), which JAX can transpose even where one
    equation (a loop's JVP) computed primal and tangent values together."""
    j = jc.convert_constvars_jaxpr(jvp_jaxpr)
    nsp, npi, nti = L.n_prefetch, L.n_primal_in, L.n_tangent_in
    npo, nto = L.n_primal_out, L.n_tangent_out
    unknown = ([False] * len(consts) + [False] * (nsp + npi) + [True] * nti
               + [False] * npo + [True] * nto + [False] * L.n_scratch
               + [True] * L.n_tangent_scratch)
    known, staged, _, _, n_res, n_res_ref = jc.pe.partial_eval_jaxpr_stateful(
        j, unknown, True, False, False, jc.pe.everything_saveable)
    if n_res_ref:
        raise NotKernelizable("the tangent computation keeps refs of the primal one")
    if hoist is not None:
        primal = [False] * n_res + [not u for u in unknown]
        staged = hoist(staged, {k for k, p in enumerate(primal) if p})
    return known, _loop_results_from_residuals(staged, n_res), n_res


def _loop_results_from_residuals(jaxpr, n_res: int):
    """The linear part with the primal values of its loops read from the residuals.

    A loop of the linear part still carries its primal values, each iteration passing
    on the value the primal part saved for it (a stacked residual). JAX's transpose
    treats every carry of a loop with linear inputs as linear, so a primal value used
    with a tangent (``acc * d_alpha`` in an online-softmax loop, ``acc / l`` after it)
    would be taken for a product of two linear values. Those values are residuals:
    inside the loop, the carry entering iteration ``t`` is the residual of iteration
    ``t - 1`` (the initial value for the first), given to the body as one more scanned
    operand; after the loop, the result is the residual of the last iteration. The
    loop's own primal carries are then left unused.
    """
    res = set(jaxpr.invars[:n_res])

    def known(v):
        return isinstance(v, jc.Literal) or v in res

    def fn(*args):
        env = dict(zip(jaxpr.invars, args))
        after: dict = {}  # loop result -> its value, the last row of a residual

        def read(v):
            if isinstance(v, jc.Literal):
                return v.val
            if v in after:
                return after[v]
            return env[v]

        for eqn in jaxpr.eqns:
            if eqn.primitive is jc.scan_p:
                outs = _scan_with_known_carries(eqn, read, known, after)
            else:
                outs = eqn.primitive.bind(*map(read, eqn.invars),
                                          **eqn.primitive.get_bind_params(eqn.params))
                outs = outs if eqn.primitive.multiple_results else [outs]
            env.update(zip(eqn.outvars, outs))
        return [read(v) for v in jaxpr.outvars]

    new, _, consts = jc.trace_kernel_to_jaxpr(fn, [v.aval for v in jaxpr.invars],
                                              "linear part")
    if consts:
        raise NotKernelizable("the linear part of the kernel captures constants")
    return new


def _scan_with_known_carries(eqn, read, known, after):
    p = eqn.params
    closed = p["jaxpr"]
    body = closed.jaxpr
    nc, ncar, rev = p["num_consts"], p["num_carry"], p["reverse"]
    xs_in = body.invars[nc + ncar:]
    subs = {}  # carry index -> stacked residual operand
    for k in range(ncar):
        out = body.outvars[k]
        if isinstance(out, jc.Var) and out in xs_in:
            operand = eqn.invars[nc + ncar + xs_in.index(out)]
            if known(operand) and known(eqn.invars[nc + k]) and jnp.issubdtype(
                    operand.aval.dtype, jnp.inexact):
                subs[k] = operand
    args = list(map(read, eqn.invars))
    if not subs:
        return jc.scan_p.bind(*args, **p)
    extra = []
    for k, operand in subs.items():
        last, entering = _entering_rows(read(operand), read(eqn.invars[nc + k]), rev)
        extra.append(entering)
        after[eqn.outvars[k]] = last
    carry_in = [body.invars[nc + k] for k in subs]

    def new_body(*xs):
        vals, entering = xs[: len(body.invars)], xs[len(body.invars):]
        benv = dict(zip(body.constvars, closed.consts))
        benv.update(zip(body.invars, vals))
        benv.update(zip(carry_in, entering))  # the carry entering this iteration
        for e in body.eqns:
            o = e.primitive.bind(*(x.val if isinstance(x, jc.Literal) else benv[x]
                                   for x in e.invars),
                                 **e.primitive.get_bind_params(e.params))
            benv.update(zip(e.outvars, o if e.primitive.multiple_results else [o]))
        outs = [x.val if isinstance(x, jc.Literal) else benv[x] for x in body.outvars]
        # the primal carries pass on their (unused) incoming values
        for k in subs:
            outs[k] = vals[nc + k]
        return outs

    avals = [v.aval for v in body.invars] + [jax.typeof(x[0]) for x in extra]
    j, _, c = jc.trace_kernel_to_jaxpr(new_body, avals, "loop body")
    params = dict(p, jaxpr=jc.ClosedJaxpr(j, c))
    if "linear" in p:
        params["linear"] = (*p["linear"], *([False] * len(extra)))
    return jc.scan_p.bind(*args, *extra, **params)


def _entering_rows(stacked, init, reverse: bool):
    """For a loop whose iteration ``t`` leaves the carry ``stacked[t]``: the carry
    entering each iteration (``init`` for the first one run) and the loop's result (the
    row of the last one run). Computed by a loop over the rows, not by slicing and
    concatenating them, so that backends without value slices (Triton) lower it."""
    init = jnp.broadcast_to(init, stacked.shape[1:]).astype(stacked.dtype)
    return lax.scan(lambda prev, row: (row, prev), init, stacked, reverse=reverse)


# ------------------------------------------------------------------------------------
# Analyses.


def _axes_used(bm, ng: int) -> list[bool]:
    """Which grid axes ``bm``'s index map depends on."""
    j = bm.index_map_jaxpr.jaxpr
    deps = {v: {k} for k, v in enumerate(j.invars[:ng])}
    for eqn in j.eqns:  # (conservative through sub-jaxprs: outputs depend on all inputs)
        d = set().union(*(deps.get(v, set()) for v in eqn.invars if isinstance(v, jc.Var)))
        for v in eqn.outvars:
            deps[v] = d
    used = set().union(*(deps.get(v, set()) for v in j.outvars if isinstance(v, jc.Var)))
    return [k in used for k in range(ng)]


def _plain_index_map(bm, ng: int) -> bool:
    """Each block index is a grid index (or one run backwards) or a constant, each grid
    index used at most once, and no scalar prefetch: distinct programs along the used axes see distinct
    blocks."""
    j = bm.index_map_jaxpr.jaxpr
    if bm.index_map_uses_prefetch:
        return False
    grid_vars = j.invars[:ng]
    reversed_ = {}  # ``n - 1 - i`` (a grid axis run backwards, as in a state sweep)
    for e in j.eqns:
        if not (e.primitive is lax.sub_p and isinstance(e.invars[0], jc.Literal)
                and e.invars[1] in grid_vars):
            return False
        reversed_[e.outvars[0]] = e.invars[1]
    seen = [reversed_.get(v, v) for v in j.outvars if not isinstance(v, jc.Literal)]
    return all(v in grid_vars for v in seen) and len(set(seen)) == len(seen)


def _accumulate_only(jaxpr, ref) -> str:
    """Why the accesses to ``ref`` are not only "store zeros" and "add into" (``""``
    when they are). Only the top level of the kernel body is inspected; a ref reaching
    a sub-jaxpr other than a ``cond`` branch (``pl.when``) is refused."""
    uses: dict = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if isinstance(v, jc.Var):
                uses.setdefault(v, []).append(eqn)
    for eqn in uses.get(ref, []):
        prim = eqn.primitive
        if prim is jc.cond_p:
            k = eqn.invars.index(ref) - 1
            for branch in eqn.params["branches"]:
                why = _accumulate_only(branch.jaxpr, branch.jaxpr.invars[k])
                if why:
                    return why
        elif prim is jc.addupdate_p:
            continue
        elif prim is jc.swap_p:
            if eqn.invars[0] is not ref:
                return "its ref is stored somewhere"
            if _is_zeros(jaxpr, eqn.invars[1]) or _is_accumulation(jaxpr, uses, eqn, ref):
                continue
            return "a store into it is neither zeros nor an accumulation"
        elif prim is jc.get_p:
            if not _feeds_accumulation(jaxpr, uses, eqn, ref):
                return "a read of it is used other than to accumulate into it"
        else:
            return f"it is passed to {prim}"
    return ""


def _producer(jaxpr, var):
    for eqn in jaxpr.eqns:
        if var in eqn.outvars:
            return eqn
    return None


def _is_zeros(jaxpr, var) -> bool:
    if isinstance(var, jc.Literal):
        return not np.any(np.asarray(var.val) != 0)
    eqn = _producer(jaxpr, var)
    if eqn is None:
        return False
    if eqn.primitive in (lax.broadcast_in_dim_p, lax.convert_element_type_p) or \
            eqn.primitive.name in ("copy", "copy_p"):
        return _is_zeros(jaxpr, eqn.invars[0])
    return False


def _is_accumulation(jaxpr, uses, swap_eqn, ref) -> bool:
    """``ref[idx] = ref[idx] + c``: the stored value is an add of a read of ``ref``."""
    add = _producer(jaxpr, swap_eqn.invars[1])
    if add is None or add.primitive not in (lax.add_p, jc.add_any_p):
        return False
    reads = [_producer(jaxpr, v) for v in add.invars if isinstance(v, jc.Var)]
    return any(r is not None and r.primitive is jc.get_p and r.invars[0] is ref
               and r.invars[1:] == swap_eqn.invars[2:] for r in reads)


def _feeds_accumulation(jaxpr, uses, get_eqn, ref) -> bool:
    (val,) = get_eqn.outvars
    consumers = uses.get(val, [])
    if len(consumers) != 1 or consumers[0].primitive not in (lax.add_p, jc.add_any_p):
        return False
    (total,) = consumers[0].outvars
    stores = uses.get(total, [])
    return len(stores) == 1 and stores[0].primitive is jc.swap_p and \
        stores[0].invars[0] is ref and stores[0].invars[2:] == get_eqn.invars[1:]


# ------------------------------------------------------------------------------------
# Building blocks.


def _store_zeros(ref):
    ref[...] = jnp.zeros(ref.shape, ref.dtype)


def _permuted(bm, perm, origin=None):
    """``bm`` with its index map taking the grid indices in the order ``perm``."""
    old = bm.index_map_jaxpr
    n = len(perm)
    avals = [v.aval for v in old.jaxpr.invars]
    new_avals = [avals[a] for a in perm] + avals[n:]

    def index_map(*args):
        ids, rest = args[:n], args[n:]
        orig = [None] * n
        for p, a in enumerate(perm):
            orig[a] = ids[p]
        return jc.core.eval_jaxpr(old.jaxpr, old.consts, *orig, *rest)

    jaxpr, _, consts = jc.trace_kernel_to_jaxpr(index_map, new_avals,
                                                f"index_map of {bm.origin}")
    return dataclasses.replace(bm, index_map_jaxpr=jc.ClosedJaxpr(jaxpr, consts),
                               origin=origin or bm.origin)


def _permuted_params(cp, perm, inner):
    """Compiler params for the reordered grid: ``dimension_semantics`` (where the
    backend's params have it) follow the axes, and the accumulation axes are
    ``"arbitrary"``."""
    sem = getattr(cp, "dimension_semantics", None)
    if sem is None or not dataclasses.is_dataclass(cp):
        return cp
    new = []
    for a in perm:
        s = sem[a]
        if a in inner:
            s = "arbitrary" if isinstance(s, str) else type(s)("arbitrary")
        new.append(s)
    return dataclasses.replace(cp, dimension_semantics=tuple(new))


def _cumsum(xs):
    out, t = [], 0
    for x in xs:
        t += x
        out.append(t)
    return out


def _split(xs, bounds):
    xs, out, lo = list(xs), [], 0
    for b in bounds:
        out.append(xs[lo:b])
        lo = b
    out.append(xs[lo:])
    return out
