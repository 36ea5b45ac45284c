"""What the two ways of emitting reverse mode as kernels share: the layout of a JVP
call's operands (:class:`JvpLayout`), tracing a transposed kernel body, asking the
target backend whether it accepts a backward kernel, the partial evaluation of the JVP
kernel into its primal and linear parts, the analysis of index maps and accumulations,
and small list helpers. :mod:`pallas._src.transforms.backward` (one backward call per
tangent input) and :mod:`pallas._src.transforms.backward_carried` (kernels that carry
state between grid steps) both build on it; it imports neither.
"""


from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas._src import jax_compat as jc
from pallas._src.registry import registry
from pallas._src.registry.requests import KernelRequest
from pallas._src.transforms.backward_pruning import NotKernelizable


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


class KernelRefAccum(jc.ad.RefAccum):
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
def constant_stores_transpose():
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
    try:
        name = registry.requested_backend(params["backend"], params["compiler_params"])
        return (registry.get_backend(name) if name is not None else
                registry.select_backend(jax.default_backend(), None,
                                        params["compiler_params"]))
    except Exception:  # noqa: BLE001 - no backend to ask (e.g. none for this platform)
        return None


def check_backend_accepts(params, jaxpr, gm, compiler_params) -> None:
    """Asks the backend the call will run on (the one named by ``backend=`` or the
    compiler params, else the default platform's) to validate the backward kernel, so
    one it cannot lower falls back to XLA instead of failing at lowering."""
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


def split_primal_and_linear(jvp_jaxpr, consts, L: JvpLayout, hoist=None):
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
    return known, loop_results_from_residuals(staged, n_res), n_res


def loop_results_from_residuals(jaxpr, n_res: int):
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
    after: dict = {}  # loop result -> its value, the last row of a residual

    def known(v):
        return isinstance(v, jc.Literal) or v in res

    def step(eqn, read):
        if eqn.primitive is jc.scan_p:
            return scan_with_known_carries(eqn, read, known, after)
        return None

    return retrace_linear_part(jaxpr, step, after)


def retrace_linear_part(jaxpr, step, overrides: dict | None = None):
    """The linear part ``jaxpr`` traced again equation by equation: ``step(eqn, read)``
    binds the equations it rewrites and returns their outputs (None: the equation is
    bound as it is); ``read`` gives a variable's value, the one in ``overrides`` (which
    ``step`` may fill) before its own. Raises :class:`NotKernelizable` when the result
    captures constants."""
    overrides = {} if overrides is None else overrides

    def fn(*args):
        env = dict(zip(jaxpr.invars, args))

        def read(v):
            if isinstance(v, jc.Literal):
                return v.val
            if v in overrides:
                return overrides[v]
            return env[v]

        for eqn in jaxpr.eqns:
            outs = step(eqn, read)
            if outs is None:
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


def scan_with_known_carries(eqn, read, known, after):
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
        last, entering = entering_rows(read(operand), read(eqn.invars[nc + k]), rev)
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


def entering_rows(stacked, init, reverse: bool):
    """For a loop whose iteration ``t`` leaves the carry ``stacked[t]``: the carry
    entering each iteration (``init`` for the first one run) and the loop's result (the
    row of the last one run). Computed by a loop over the rows, not by slicing and
    concatenating them, so that backends without value slices (Triton) lower it."""
    init = jnp.broadcast_to(init, stacked.shape[1:]).astype(stacked.dtype)
    return lax.scan(lambda prev, row: (row, prev), init, stacked, reverse=reverse)


# ------------------------------------------------------------------------------------
# Analyses.


def axes_used(bm, ng: int) -> list[bool]:
    """Which grid axes ``bm``'s index map depends on."""
    j = bm.index_map_jaxpr.jaxpr
    deps = {v: {k} for k, v in enumerate(j.invars[:ng])}
    for eqn in j.eqns:  # (conservative through sub-jaxprs: outputs depend on all inputs)
        d = set().union(*(deps.get(v, set()) for v in eqn.invars if isinstance(v, jc.Var)))
        for v in eqn.outvars:
            deps[v] = d
    used = set().union(*(deps.get(v, set()) for v in j.outvars if isinstance(v, jc.Var)))
    return [k in used for k in range(ng)]


def plain_index_map(bm, ng: int) -> bool:
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


def accumulate_only(jaxpr, ref) -> str:
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
                why = accumulate_only(branch.jaxpr, branch.jaxpr.invars[k])
                if why:
                    return why
        elif prim is jc.addupdate_p:
            continue
        elif prim is jc.swap_p:
            if eqn.invars[0] is not ref:
                return "its ref is stored somewhere"
            if is_zeros(jaxpr, eqn.invars[1]) or is_accumulation(jaxpr, uses, eqn, ref):
                continue
            return "a store into it is neither zeros nor an accumulation"
        elif prim is jc.get_p:
            if not feeds_accumulation(jaxpr, uses, eqn, ref):
                return "a read of it is used other than to accumulate into it"
        else:
            return f"it is passed to {prim}"
    return ""


def producer(jaxpr, var):
    for eqn in jaxpr.eqns:
        if var in eqn.outvars:
            return eqn
    return None


def is_zeros(jaxpr, var) -> bool:
    if isinstance(var, jc.Literal):
        return not np.any(np.asarray(var.val) != 0)
    eqn = producer(jaxpr, var)
    if eqn is None:
        return False
    if eqn.primitive in (lax.broadcast_in_dim_p, lax.convert_element_type_p) or \
            eqn.primitive.name in ("copy", "copy_p"):
        return is_zeros(jaxpr, eqn.invars[0])
    return False


def is_accumulation(jaxpr, uses, swap_eqn, ref) -> bool:
    """``ref[idx] = ref[idx] + c``: the stored value is an add of a read of ``ref``."""
    add = producer(jaxpr, swap_eqn.invars[1])
    if add is None or add.primitive not in (lax.add_p, jc.add_any_p):
        return False
    reads = [producer(jaxpr, v) for v in add.invars if isinstance(v, jc.Var)]
    return any(r is not None and r.primitive is jc.get_p and r.invars[0] is ref
               and r.invars[1:] == swap_eqn.invars[2:] for r in reads)


def feeds_accumulation(jaxpr, uses, get_eqn, ref) -> bool:
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


def store_zeros(ref):
    ref[...] = jnp.zeros(ref.shape, ref.dtype)


def permuted(bm, perm, origin=None):
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


def permuted_params(cp, perm, inner):
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


def cumsum(xs):
    out, t = [], 0
    for x in xs:
        t += x
        out.append(t)
    return out
