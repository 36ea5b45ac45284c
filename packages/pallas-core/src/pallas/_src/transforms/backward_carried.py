"""Backward kernels for kernels that carry state from one grid step to the next.

A kernel carries state along its sequential grid axes when it revisits an output block
other than by "store zeros, then add into it" (an accumulator rescaled at every step,
``o = o * a + x @ w``; a flash-attention output written at the last key step) or reads
scratch before writing it in a step (the online-softmax state ``m, l, acc`` of a flash
attention whose key axis is a grid axis). Each grid step ``t`` maps the state entering
it to the state leaving it, so the cotangent of the state must flow through the steps
in reverse. The backward pass is then three kinds of ``pallas_call``s of the call's
backend:

1. **saving forward** (only if the backward needs primal state): the forward kernel
   that also writes the state entering every step into stacked outputs (the
   residuals). It recomputes the forward in the backward pass (rematerialisation).
2. **state sweep** (``"<kernel> (backward, carried state)"``): the JVP kernel transposed
   with respect to its tangent refs, on the grid in reverse order (every index map and
   ``program_id`` reversed), keeping the state's cotangent in scratch from one step to
   the next: the cotangent of a revisited output block starts as the output's cotangent
   at its last visit, that of carried scratch at zero (at the start of each sequential
   lane, where the kernel resets it). Before transposing step ``t`` it writes the
   cotangent of the state leaving step ``t`` into stacked outputs.
3. **per input** (``"<kernel> (backward, <input>)"``, as for kernels without carried
   state): each step is now program-local, its state and the cotangent of the state
   leaving it read from the stacked arrays, so the input's cotangent accumulates over
   a reordered grid as in :mod:`pallas._src.transforms.backward`.

Stacked arrays have shape ``(*grid, *state)``; a block holds the whole extent of the
grid axes no output's index map uses (the sequential axes, which Triton loops over
inside one program) and is indexed by ``program_id`` along them, so the sequential axes
stay sequential on every backend. What cannot be done raises :class:`NotKernelizable`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp

from pallas._src import block_spec as bs
from pallas._src import jax_compat as jc
from pallas._src.grid_spec import resolve_block_mapping
from pallas._src.interpreter.analysis import ref_live_in
from pallas._src.jaxpr_util import split_list
from pallas._src.memory import MemoryRef
from pallas._src.pallas_call import pallas_call_p
from pallas._src.primitives import control
from pallas._src.primitives.grid import program_id
from pallas._src.transforms import backward_common as bc
from pallas._src.transforms.backward_pruning import NotKernelizable, prune_refs
from pallas._src.transforms.backward_replay import hoist_primal_stores, zeros_for_empty
from pallas._src.transforms.grid_axes import remap_grid_axes, reverse_program_ids


@dataclasses.dataclass(frozen=True)
class CarriedState:
    """What a kernel carries across grid steps (see :func:`analyse`)."""

    seq: tuple  # grid axes no blocked primal output uses (whole inside stacked blocks)
    tscr: tuple  # per tangent scratch: None (program-local) or the axes resetting it
    tout: tuple  # per tangent output: None (one visit) or the axes it is revisited along
    res: tuple  # primal refs read before written: ("scratch" | "out", index)
    res_reset: tuple  # per res: written before read at the start of each sequential lane

    @property
    def carried(self) -> list:
        """The tangent refs whose cotangent flows between steps."""
        return ([("tscr", j) for j, t in enumerate(self.tscr) if t is not None]
                + [("tout", k) for k, t in enumerate(self.tout) if t is not None])


def analyse(closed, L, gm) -> CarriedState | None:
    """The state a JVP kernel carries between grid steps, or None when it carries none
    (scratch is program-local and revisited outputs only accumulate)."""
    j, ng, grid = closed.jaxpr, len(gm.grid), gm.grid
    first_out = L.n_prefetch + L.n_primal_in + L.n_tangent_in
    first_tout = first_out + L.n_primal_out
    first_scr = first_tout + L.n_tangent_out
    first_tscr = first_scr + L.n_scratch
    tout_bms = gm.out_block_mappings[L.n_primal_out:]
    revisited = [not bc.plain_index_map(bm, ng) or not all(bc.axes_used(bm, ng))
                 for bm in tout_bms]
    live_tscr = [ref_live_in(j, first_tscr + i, {}, grid)
                 for i in range(L.n_tangent_scratch)]
    if not any(live_tscr) and not any(
            r and bc.accumulate_only(j, j.invars[first_tout + k])
            for k, r in enumerate(revisited)):
        return None
    tout = []
    for bm, r in zip(tout_bms, revisited):
        if not r:
            tout.append(None)
            continue
        if not bc.plain_index_map(bm, ng):
            raise NotKernelizable(f"the index map of {bm.origin} is not a plain block index")
        used = bc.axes_used(bm, ng)
        axes = tuple(a for a in range(ng) if not used[a])
        if any(used[a] for a in range(axes[0], ng)):
            raise NotKernelizable(f"{bm.origin} is revisited along grid axes that are not "
                                  f"innermost (its visits are not consecutive)")
        tout.append(axes)
    blocked = [bc.axes_used(bm, ng) for bm in gm.out_block_mappings[: L.n_primal_out]
               if not bm.whole]
    seq = tuple(a for a in range(ng) if blocked and not any(u[a] for u in blocked))
    tscr = []
    for i, live in enumerate(live_tscr):
        if not live:
            tscr.append(None)
        elif seq and not ref_live_in(j, first_tscr + i, {a: 0 for a in seq}, grid):
            tscr.append(seq)  # reset at the start of each sequential lane
        else:
            tscr.append(tuple(range(ng)))  # carried through the whole grid
    res = [("scratch", k) for k in range(L.n_scratch) if ref_live_in(j, first_scr + k, {}, grid)]
    res += [("out", k) for k, bm in enumerate(gm.out_block_mappings[: L.n_primal_out])
            if not all(bc.axes_used(bm, ng)) and ref_live_in(j, first_out + k, {}, grid)]
    lane_start = {a: 0 for a in seq}
    reset = [bool(seq) and not ref_live_in(
        j, (first_scr if w == "scratch" else first_out) + i, lane_start, grid)
        for w, i in res]
    return CarriedState(seq, tuple(tscr), tuple(tout), tuple(res), tuple(reset))


# ------------------------------------------------------------------------------------
# Stacked per-step arrays and remapped block mappings.


def _stacked_bm(origin, shape, dtype, gm, seq):
    """An array ``(*grid, *shape)`` with one slot per grid step, tiled so that a block
    holds the whole extent of the sequential axes ``seq`` (see the module docstring)."""
    ng = len(gm.grid)
    aval = jc.ShapedArray((*gm.grid, *shape), dtype)
    block = tuple(g if a in seq else None for a, g in enumerate(gm.grid)) + tuple(shape)
    tail = (0,) * len(shape)

    def index_map(*args):
        return (*(0 if a in seq else args[a] for a in range(ng)), *tail)

    return resolve_block_mapping(origin, bs.BlockSpec(block, index_map), aval, gm.grid,
                                 gm.prefetch_avals)


def _remapped(bm, n, to_orig, origin=None):
    """``bm`` on a new grid: ``to_orig`` maps the new grid indices to the original ones."""
    old = bm.index_map_jaxpr
    avals = [v.aval for v in old.jaxpr.invars]

    def index_map(*args):
        return jc.core.eval_jaxpr(old.jaxpr, old.consts, *to_orig(args[:n]), *args[n:])

    jaxpr, _, consts = jc.trace_kernel_to_jaxpr(index_map, avals, f"index_map of {bm.origin}")
    return dataclasses.replace(bm, index_map_jaxpr=jc.ClosedJaxpr(jaxpr, consts),
                               origin=origin or bm.origin)


def _at(ref, slot):
    return ref[slot] if slot else ref[...]


def _put(ref, slot, val):
    if slot:
        ref[slot] = val
    else:
        ref[...] = val


def _save(dst, slot, src):
    _put(dst, slot, src[...])


def _copy(dst, src):
    dst[...] = src[...]


def _when_all(conds, fn):
    if conds:
        control.when(functools.reduce(jnp.logical_and, conds))(fn)
    else:
        fn()


def _state_aval(gm, L, key):
    what, i = key
    if what in ("tscr", "scratch"):
        t = gm.scratch_types[i + (L.n_scratch if what == "tscr" else 0)]
        return t.inner_aval.shape, t.inner_aval.dtype, gm.scratch_origins[
            i + (L.n_scratch if what == "tscr" else 0)]
    bm = gm.out_block_mappings[i + (L.n_primal_out if what == "tout" else 0)]
    return bm.ref_shape, bm.array_aval.dtype, bm.origin


# ------------------------------------------------------------------------------------
# The backward calls.


@dataclasses.dataclass(frozen=True)
class _Built:
    jaxpr: object
    gm: object
    inputs: tuple  # the role of each input: ("pin" | "ctt" | "res" | "cta", index)
    out_avals: tuple
    name: str
    compiler_params: object


def _build(kind, n, params, L, info, stacks, seed):
    """The state sweep (``kind="state"``) or the backward call of tangent input ``n``;
    ``seed``: the primal state is read from the residuals (else it must be unused)."""
    gm, closed = params["grid_mapping"], params["jaxpr"]
    G, ng = gm.grid, len(gm.grid)
    nsp, npi, npo, nto, nti = (L.n_prefetch, L.n_primal_in, L.n_primal_out,
                               L.n_tangent_out, L.n_tangent_in)
    res_bms, cta_bms = stacks
    carried = info.carried
    if kind == "state":
        def to_orig(ids):
            return [G[a] - 1 - ids[a] for a in range(ng)]

        try:
            jvp_jaxpr = reverse_program_ids(closed.jaxpr, G)
        except ValueError as e:
            raise NotKernelizable(str(e)) from e
        grid, names, perm, inner = G, gm.grid_names, list(range(ng)), []
        cp = params["compiler_params"]
        what = f"backward kernel of {params['name']} for its carried state"
        name = f"{params['name']} (backward, carried state)"
    else:
        bm_n = gm.in_block_mappings[npi + n]
        if not bc.plain_index_map(bm_n, ng):
            raise NotKernelizable(f"the index map of {bm_n.origin} is not a plain block index")
        used = bc.axes_used(bm_n, ng)
        inner = [a for a in range(ng) if not used[a]]
        perm = [a for a in range(ng) if used[a]] + inner
        pos = {a: p for p, a in enumerate(perm)}

        def to_orig(ids):
            return [ids[pos[a]] for a in range(ng)]

        jvp_jaxpr = remap_grid_axes(closed.jaxpr, pos.__getitem__)
        grid = tuple(G[a] for a in perm)
        names = None if gm.grid_names is None else tuple(gm.grid_names[a] for a in perm)
        cp = bc.permuted_params(params["compiler_params"], perm, inner)
        what = f"backward kernel of {params['name']} for {bm_n.origin}"
        name = f"{params['name']} (backward, {bm_n.origin})"

    def remap(bm, origin=None):
        return _remapped(bm, ng, to_orig, origin)

    pin_bms = [remap(bm) for bm in gm.in_block_mappings[:npi]]
    tout_bms = gm.out_block_mappings[npo:]
    ctt_bms = [remap(bm, f"cotangent of {bm.origin}") for bm in tout_bms]
    r_bms = [remap(bm) for bm in res_bms]
    a_bms = [remap(bm) for bm in cta_bms]
    if kind == "state":
        in_bms, out_bms = [*pin_bms, *ctt_bms, *r_bms], a_bms
        roles = ([("pin", i) for i in range(npi)] + [("ctt", k) for k in range(nto)]
                 + [("res", r) for r in range(len(r_bms))])
    else:
        in_bms = [*pin_bms, *ctt_bms, *r_bms, *a_bms]
        out_bms = [remap(bm_n, f"cotangent of {bm_n.origin}")]
        roles = ([("pin", i) for i in range(npi)] + [("ctt", k) for k in range(nto)]
                 + [("res", r) for r in range(len(r_bms))]
                 + [("cta", c) for c in range(len(a_bms))])
    local = ([MemoryRef(jc.ShapedArray(bm.ref_shape, bm.array_aval.dtype),
                        bm.memory_space) for bm in gm.out_block_mappings[:npo]]
             + [MemoryRef(jc.ShapedArray(bm.ref_shape, bm.array_aval.dtype),
                          bm.memory_space) for bm in tout_bms]
             + [MemoryRef(jc.ShapedArray(bm.ref_shape, bm.array_aval.dtype),
                          bm.memory_space)
                for j, bm in enumerate(gm.in_block_mappings[npi:])
                if kind == "state" or j != n])
    scr_types = list(gm.scratch_types)
    pf_avals = [jc.AbstractRef(a, memory_space=None) for a in gm.prefetch_avals]
    avals = [*pf_avals, *(bm.ref_aval for bm in in_bms), *(bm.ref_aval for bm in out_bms),
             *(t.get_ref_aval() for t in scr_types), *(t.get_ref_aval() for t in local)]
    n_r, n_a = len(r_bms), len(a_bms) if kind != "state" else 0
    bounds = bc.cumsum([nsp, npi, nto, n_r, n_a, len(out_bms), L.n_scratch,
                         L.n_tangent_scratch, npo, nto])
    primal_part, linear_part, n_res = bc.split_primal_and_linear(
        jvp_jaxpr, closed.consts, L, hoist=hoist_primal_stores)
    primal_part = zeros_for_empty(primal_part)
    slot_of = {key: c for c, key in enumerate(carried)}

    def body(*refs):
        pf, pins, ctt, res, cta, outs, scr, ct_scr, pout, tloc, sinks = split_list(refs, bounds)
        raw = [program_id(p) for p in range(ng)]
        fwd = to_orig(raw)
        slot = tuple(fwd[a] for a in info.seq)
        for j, axes in enumerate(info.tscr):
            if axes is None:
                bc.store_zeros(ct_scr[j])
            elif kind == "state":
                _when_all([raw[a] == 0 for a in axes],
                          functools.partial(bc.store_zeros, ct_scr[j]))
            else:
                ct_scr[j][...] = _at(cta[slot_of[("tscr", j)]], slot)
        for k, axes in enumerate(info.tout):
            if axes is None:
                _copy(tloc[k], ctt[k])
            elif kind == "state":
                _when_all([raw[a] == 0 for a in axes], functools.partial(_copy, tloc[k], ctt[k]))
            else:
                tloc[k][...] = _at(cta[slot_of[("tout", k)]], slot)
        if kind == "state":
            for c, (w, i) in enumerate(carried):
                _put(outs[c], slot, (ct_scr if w == "tscr" else tloc)[i][...])
            tins = list(sinks)
        else:
            (ctn,) = outs
            _when_all([raw[pos[a]] == 0 for a in inner],
                      functools.partial(bc.store_zeros, ctn))
            sink_it = iter(sinks)
            tins = [ctn if j == n else next(sink_it) for j in range(nti)]
        def seed_state():
            for r, (w, i) in enumerate(info.res):
                (scr if w == "scratch" else pout)[i][...] = _at(res[r], slot)

        if seed:
            seed_state()
        known = [*closed.consts, *pf, *pins, *pout, *scr]
        residuals = jc.core.eval_jaxpr(primal_part, (), *known)[:n_res]
        if seed:  # the linear part replays the primal ref accesses from the same state
            seed_state()
        env = [*residuals, *closed.consts, *pf, *pins, *map(bc.KernelRefAccum, tins), *pout,
               *map(bc.KernelRefAccum, tloc), *scr, *map(bc.KernelRefAccum, ct_scr)]
        with bc.constant_stores_transpose():
            jc.ad.backward_pass3(linear_part, False, (), env, [])
        return []

    jaxpr, consts = bc.trace_transposed_body(body, avals, what, names, grid)
    n_in, n_out = len(in_bms), len(out_bms)
    first_scr = nsp + n_in + n_out
    first_local = first_scr + len(scr_types)
    dead = set(range(first_local, first_local + npo)) | set(
        range(first_local + npo + nto, len(avals)))
    if seed:  # the seeded primal outputs are needed
        dead -= {first_local + i for w, i in info.res if w == "out"}
    else:  # carried primal scratch is not seeded: nothing may need it
        dead |= {first_scr + i for w, i in info.res if w == "scratch"}
    keep = set(range(nsp)) | set(range(nsp + n_in, first_scr))
    jaxpr, consts, kept = prune_refs(jaxpr, consts, avals, dead, keep, what)
    k_in = kept[nsp: nsp + n_in]
    k_scr = kept[first_scr:first_local]
    k_loc = kept[first_local:]
    scr_origins = (*gm.scratch_origins[: L.n_scratch],
                   *(f"cotangent of {o}" for o in gm.scratch_origins[L.n_scratch:]))
    new_gm = dataclasses.replace(
        gm, grid=grid, grid_names=names,
        block_mappings=(*(bm for bm, k in zip(in_bms, k_in) if k), *out_bms),
        num_inputs=sum(k_in), num_outputs=n_out,
        scratch_types=(*(t for t, k in zip(scr_types, k_scr) if k),
                       *(t for t, k in zip(local, k_loc) if k)),
        scratch_origins=(*(o for o, k in zip(scr_origins, k_scr) if k),
                         *(f"backward local {i}" for i, k in enumerate(k_loc) if k)),
        input_output_aliases=(),
    )
    new_jaxpr = jc.ClosedJaxpr(jaxpr, consts)
    bc.check_backend_accepts(params, new_jaxpr, new_gm, cp)
    return _Built(new_jaxpr, new_gm, tuple(r for r, k in zip(roles, k_in) if k),
                  tuple(bm.array_aval for bm in out_bms), name, cp)


def _saving_forward(pp, info, used, res_bms):
    """The forward call that also writes the primal state entering each step (the
    residuals ``used``) into stacked outputs."""
    pgm, pj = pp["grid_mapping"], pp["jaxpr"]
    nsp, nin, nout = pgm.num_scalar_prefetch, pgm.num_inputs, pgm.num_outputs
    bms = [res_bms[r] for r in used]
    pf_avals = [jc.AbstractRef(a, memory_space=None) for a in pgm.prefetch_avals]
    avals = [*pf_avals, *(bm.ref_aval for bm in pgm.block_mappings),
             *(bm.ref_aval for bm in bms), *(t.get_ref_aval() for t in pgm.scratch_types)]
    bounds = bc.cumsum([nsp, nin, nout, len(bms)])

    def body(*refs):
        pf, ins, outs, res, scr = split_list(refs, bounds)
        slot = tuple(program_id(a) for a in info.seq)
        for r, ref in zip(used, res):
            w, i = info.res[r]
            save = functools.partial(_save, ref, slot, (scr if w == "scratch" else outs)[i])
            if info.res_reset[r]:  # the state entering a lane is never read: not saved
                control.when(functools.reduce(jnp.logical_or,
                                              [s != 0 for s in slot]))(save)
            else:
                save()
        jc.core.eval_jaxpr(pj.jaxpr, pj.consts, *pf, *ins, *outs, *scr)
        return []

    what = f"forward kernel of {pp['name']} saving its carried state"
    if pgm.grid_names is not None:
        with jc.extend_axis_env_nd(list(zip(pgm.grid_names, pgm.grid))):
            jaxpr, _, consts = jc.trace_kernel_to_jaxpr(body, avals, what)
    else:
        jaxpr, _, consts = jc.trace_kernel_to_jaxpr(body, avals, what)
    new_gm = dataclasses.replace(pgm, block_mappings=(*pgm.block_mappings, *bms),
                                 num_outputs=nout + len(bms))
    new_jaxpr = jc.ClosedJaxpr(jaxpr, consts)
    bc.check_backend_accepts(pp, new_jaxpr, new_gm, pp["compiler_params"])
    return _Built(new_jaxpr, new_gm, (), (*pp["out_avals"], *(bm.array_aval for bm in bms)),
                  f"{pp['name']} (forward, saving state)", pp["compiler_params"])


def _bind(b: _Built, params, operands):
    return pallas_call_p.bind(
        *operands, **dict(params, jaxpr=b.jaxpr, grid_mapping=b.gm, out_avals=b.out_avals,
                          checks=None, cost_estimate=None, name=b.name,
                          compiler_params=b.compiler_params))


def transpose_carried(ct_touts, known, params, L, info: CarriedState, primal_params):
    """The cotangents of the tangent inputs of a JVP call whose kernel carries state
    (``known``: prefetch and primal operands; ``ct_touts``: one cotangent per tangent
    output), as the calls described in the module docstring."""
    gm = params["grid_mapping"]
    if gm.input_output_aliases:
        raise NotKernelizable("the call aliases inputs to outputs")
    b = bc.target_backend(params)
    caps = b.capabilities if b is not None else frozenset()  # a backend claiming no tag
    if caps and "*" not in caps and "scratch" not in caps:  # (a test's) is not refused
        raise NotKernelizable(f"the state sweep carries cotangents in scratch from one grid "
                              f"step to the next, and backend {b.name!r} does not claim "
                              f"'scratch'")
    stacks = []
    for keys, verb in ((info.res, "entering"), (info.carried, "after")):
        bms = []
        for key in keys:
            shape, dtype, origin = _state_aval(gm, L, key)
            label = ("state of" if verb == "entering" else "cotangent of")
            bms.append(_stacked_bm(f"{label} {origin} {verb} each step", shape, dtype, gm,
                                   info.seq))
        stacks.append(bms)
    built = None
    for seed in (False, True):
        try:
            built = [_build("state", None, params, L, info, stacks, seed)]
            built += [_build("input", n, params, L, info, stacks, seed)
                      for n in range(L.n_tangent_in)]
            break
        except NotKernelizable:
            if seed or not info.res:
                raise
    used = sorted({i for b in built for role, i in b.inputs if role == "res"})
    if used:
        if primal_params is None:
            raise NotKernelizable("the forward call of the kernel is unknown")
        fwd = _saving_forward(primal_params, info, used, stacks[0])
        outs = _bind(fwd, primal_params, known)
        saved = dict(zip(used, outs[primal_params["grid_mapping"].num_outputs:]))
    else:
        saved = {}
    nsp = L.n_prefetch
    pf, pins = known[:nsp], known[nsp:]

    def operands(b, cta):
        table = {"pin": pins, "ctt": ct_touts, "res": saved, "cta": cta}
        return [*pf, *(table[role][i] for role, i in b.inputs)]

    cta = _bind(built[0], params, operands(built[0], None))
    return [_bind(b, params, operands(b, cta))[0] for b in built[1:]]
