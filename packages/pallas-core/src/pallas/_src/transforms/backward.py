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

import dataclasses
import functools

import jax.numpy as jnp

from pallas._src import jax_compat as jc
from pallas._src.interpreter import analysis
from pallas._src.jaxpr_util import split_list
from pallas._src.memory import MemoryRef
from pallas._src.pallas_call import pallas_call_p
from pallas._src.primitives import control
from pallas._src.primitives.grid import program_id
from pallas._src.transforms import backward_carried
from pallas._src.transforms.backward_common import (
    JvpLayout,
    KernelRefAccum,
    accumulate_only,
    axes_used,
    check_backend_accepts,
    constant_stores_transpose,
    cumsum,
    permuted,
    permuted_params,
    plain_index_map,
    split_primal_and_linear,
    store_zeros,
    trace_transposed_body,
)
from pallas._src.transforms.backward_pruning import NotKernelizable, drop_dead_locals
from pallas._src.transforms.backward_replay import zeros_for_empty
from pallas._src.transforms.grid_axes import remap_grid_axes
from pallas._src.transforms.kernel_facts import written_refs


def transpose_as_kernels(cts, args, params, layout: JvpLayout, primal_params=None) -> list:
    """Cotangents of the tangent inputs of a JVP call, computed by backward calls.

    ``args`` are the call's operands (the tangent inputs undefined), ``cts`` one
    cotangent per output, ``primal_params`` the params of the forward call (needed when
    the kernel carries state between grid steps, see
    :mod:`pallas._src.transforms.backward_carried`). Raises :class:`NotKernelizable`
    when it cannot.
    """
    gm, closed = params["grid_mapping"], params["jaxpr"]
    L = layout
    if gm.input_output_aliases:
        raise NotKernelizable("the call aliases inputs to outputs")
    if any(type(ct) is not jc.Zero for ct in cts[: L.n_primal_out]):
        raise NotKernelizable("cotangents flow into the primal outputs of the JVP call")
    written = written_refs(closed.jaxpr)
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
        if not plain_index_map(bm, ng) or not all(axes_used(bm, ng)):
            ref = closed.jaxpr.invars[first_tin + L.n_tangent_in + L.n_primal_out + k]
            why = accumulate_only(closed.jaxpr, ref)
            if why:
                raise NotKernelizable(f"tangent output {bm.origin} is revisited along "
                                      f"a grid axis and {why}")
    return [_backward_call(n, known, ct_touts, params, layout)
            for n in range(L.n_tangent_in)]


def _scratch_carried(closed, L: JvpLayout, grid) -> bool:
    """Whether some scratch buffer may be read before it is written in a program (its
    value then comes from the previous grid step). Scratch that every program writes
    first is program-local: its cotangent starts at zero in each backward program."""
    first = (L.n_prefetch + L.n_primal_in + L.n_tangent_in + L.n_primal_out
             + L.n_tangent_out)
    return analysis.scratch_live_in(closed.jaxpr, first, {}, grid)


def _backward_call(n, known, ct_touts, params, L: JvpLayout):
    gm, closed = params["grid_mapping"], params["jaxpr"]
    ng = len(gm.grid)
    bm_n = gm.in_block_mappings[L.n_primal_in + n]
    if not plain_index_map(bm_n, ng):
        raise NotKernelizable(f"the index map of {bm_n.origin} is not a plain block index")
    used = axes_used(bm_n, ng)
    outer = [a for a in range(ng) if used[a]]
    inner = [a for a in range(ng) if not used[a]]
    perm = outer + inner  # new position p holds original axis perm[p]
    pos = {a: p for p, a in enumerate(perm)}
    grid = tuple(gm.grid[a] for a in perm)
    names = None if gm.grid_names is None else tuple(gm.grid_names[a] for a in perm)

    nsp, npi = L.n_prefetch, L.n_primal_in
    pin_bms = [permuted(bm, perm) for bm in gm.in_block_mappings[:npi]]
    tout_bms = gm.out_block_mappings[L.n_primal_out:]
    ctt_bms = [permuted(bm, perm, origin=f"cotangent of {bm.origin}") for bm in tout_bms]
    ctn_bm = permuted(bm_n, perm, origin=f"cotangent of {bm_n.origin}")
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
    primal_part, linear_part, n_res = split_primal_and_linear(jvp_jaxpr, closed.consts, L)
    primal_part = zeros_for_empty(primal_part)
    bounds = cumsum([nsp, npi, n_tout, 1, L.n_scratch, L.n_tangent_scratch,
                      L.n_primal_out, n_tout])

    def body(*refs):
        pf, pins, ctt, (ctn,), scr, ct_scr, pout, tloc, sinks = split_list(refs, bounds)
        for r in ct_scr:
            store_zeros(r)
        zero = functools.partial(store_zeros, ctn)
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
        env = [*residuals, *closed.consts, *pf, *pins, *map(KernelRefAccum, tins), *pout,
               *map(KernelRefAccum, tloc), *scr, *map(KernelRefAccum, ct_scr)]
        with constant_stores_transpose():
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
    new_params = permuted_params(params["compiler_params"], perm, inner)
    check_backend_accepts(params, new_jaxpr, new_gm, new_params)
    (ct,) = pallas_call_p.bind(
        *known, *ct_touts,
        **dict(params, jaxpr=new_jaxpr, grid_mapping=new_gm,
               out_avals=(out_aval,), checks=None, cost_estimate=None,
               name=f"{params['name']} (backward, {bm_n.origin})",
               compiler_params=new_params))
    return ct
