"""Lowering rules of semaphores, DMAs and the TPU primitives (``roll``, ``bitcast``,
packing, stochastic rounding, the PRNG, tracing, debug printing)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, scf
from jaxlib.mosaic.python import tpu

from pallas_tpu._src import core_compat as cc
from pallas_tpu._src.lowering import types as T
from pallas_tpu._src.lowering.common import (
    aval_in,
    aval_out,
    cmpi,
    const,
    int_bits,
    kind,
    materialize,
    to_i32,
)
from pallas_tpu._src.lowering.engine import rule
from pallas_tpu._src.lowering.values import RefVal
from pallas_tpu._src.lowering.windows import apply_transforms, window_memref
from pallas_tpu._src.memory import MemorySpace, SemaphoreType
from pallas_tpu._src.primitives import dma, misc, mxu
from pallas_tpu._src.primitives import refs as R
from pallas_tpu._src.primitives import vector as tpu_vector

# ------------------------------------------------------------------------------------------
# Semaphores and DMAs.


def _sem_view(ref: RefVal, flat, tree) -> ir.Value:
    w = apply_transforms(ref, flat, tree)
    if w.shape:
        raise ValueError(f"a semaphore operation needs a single semaphore; got a view of "
                         f"shape {w.shape} (index it: sem.at[i])")
    return window_memref(w)


@rule(cc.semaphore_signal_p)
def _sem_signal(lctx, eqn, sem, *rest):
    p = eqn.params
    n = p["tree"].num_leaves
    idx, inc = rest[:n], rest[n]
    dev = rest[n + 1:n + 1 + p["device_id_tree"].num_leaves]
    core = rest[n + 1 + len(dev):] if p["has_core"] else ()
    device_id = (_device_id(dev, p["device_id_type"], lctx, p["device_id_tree"])
                 if dev else None)
    tpu.sem_signal(_sem_view(sem, idx, p["tree"]), to_i32(inc), device_id=device_id,
                   core_id=to_i32(core[0]) if core else None)
    return []


def _device_id(dev, device_id_type, lctx=None, tree=None):
    """The logical device id Mosaic expects, from a logical id or mesh coordinates."""
    from pallas import DeviceIdType

    if tree is not None and device_id_type != DeviceIdType.LOGICAL and lctx is not None:
        spec = jax.tree_util.tree_unflatten(tree, list(dev))
        if isinstance(spec, dict):  # {axis: i} / {(axis, ...): i}, in the mesh's order
            dev = _dict_coords(spec, lctx.mesh_axes)
    if device_id_type == DeviceIdType.LOGICAL or len(dev) == 1 and (
            lctx is None or len(lctx.mesh_axes) <= 1):
        if len(dev) != 1:
            raise ValueError(f"a logical device id is one integer; got {len(dev)}")
        return to_i32(dev[0])
    sizes = [s for _, s in lctx.mesh_axes]
    if len(dev) != len(sizes):
        raise NotImplementedError(
            f"a mesh device id with {len(dev)} coordinates for a mesh with axes "
            f"{[n for n, _ in lctx.mesh_axes]} (pass every coordinate, or a logical id)"
        )
    out = to_i32(dev[0])
    for c, n in zip(dev[1:], sizes[1:]):
        out = arith.addi(arith.muli(out, const((), jnp.int32, n)), to_i32(c))
    return out


def _dict_coords(spec: dict, mesh_axes) -> list:
    """The coordinates, in mesh-axis order, of a dict device id (a key may be a tuple
    of axes: a joint axis, its index row-major over them)."""
    names = [n for n, _ in mesh_axes]
    sizes = dict(mesh_axes)
    coords = {}
    for key, value in spec.items():
        axes = key if isinstance(key, tuple) else (key,)
        unknown = [a for a in axes if a not in sizes]
        if unknown:
            raise ValueError(f"device_id names axes {unknown} that the kernel's mesh "
                             f"{names} does not have")
        v = to_i32(value)
        if len(axes) == 1:
            coords[axes[0]] = v
            continue
        for a in reversed(axes):
            n = const((), jnp.int32, sizes[a])
            coords[a], v = arith.remsi(v, n), arith.divsi(v, n)
    missing = [n for n in names if n not in coords]
    if missing:
        raise NotImplementedError(
            f"a device_id dict without the mesh axes {missing} (of {names}) on Mosaic TPU: "
            f"give every axis, or a logical id")
    return [coords[n] for n in names]


@rule(cc.semaphore_wait_p)
def _sem_wait(lctx, eqn, sem, *rest):
    p = eqn.params
    n = p["tree"].num_leaves
    idx, value = rest[:n], rest[n]
    view = _sem_view(sem, idx, p["tree"])
    amount = to_i32(materialize(value, aval_in(eqn, 1 + n)))
    tpu.sem_wait(view, amount)
    if not p["decrement"]:  # Mosaic's wait always decrements: give the count back
        tpu.sem_signal(view, amount)
    return []


@rule(cc.semaphore_read_p)
def _sem_read(lctx, eqn, sem, *idx):
    return tpu.sem_read(_sem_view(sem, idx, eqn.params["tree"]))


def _ref_views(spec, invals):
    out = []
    for entry in R.unflatten(spec, invals):
        if entry is None:
            out.append(None)
            continue
        base, flat, tree = entry
        out.append((base, apply_transforms(base, flat, tree)))
    return out


@rule(dma.dma_start_p)
def _dma_start(lctx, eqn, *invals):
    p = eqn.params
    avals = [v.aval for v in eqn.invars]
    pos, n, tree = p["refs"][0]
    src_aval = R.view_aval_from(avals[pos], avals[pos + 1:pos + 1 + n], tree)
    if src_aval.dtype == jnp.bool_:
        # Refused first, as upstream's lowering does (TPU memory holds no bool type).
        raise NotImplementedError(
            f"DMAs with bool dtypes are not supported. (a copy of {src_aval.str_short()}: "
            f"copy it as int32 with x.astype(jnp.int32), or as int8)")
    dma.check_copy_eqn(eqn)
    end = R.spec_end(p["refs"])
    (src, ws), (dst, wd), (sem, wm), src_sem = _ref_views(p["refs"], invals[:end])
    if p["add"]:
        raise NotImplementedError("DMAs with add=True on Mosaic TPU")
    dev = list(invals[end:])
    device_id = (_device_id(dev, p["device_id_type"], lctx, p["device_id_tree"])
                 if dev else None)
    tpu.enqueue_dma(
        window_memref(ws), window_memref(wd),
        source_semaphore=window_memref(src_sem[1]) if src_sem is not None else None,
        target_semaphore=window_memref(wm), device_id=device_id,
        priority=p["priority"] if p["priority"] else None,
    )
    return []


@rule(dma.dma_wait_p)
def _dma_wait(lctx, eqn, *invals):
    p = eqn.params
    end = R.spec_end(p["refs"])
    (sem, wm), (src, ws), (dst, wd) = _ref_views(p["refs"], invals[:end])
    dev = list(invals[end:])
    device_id = (_device_id(dev, p["device_id_type"], lctx, p["device_id_tree"])
                 if dev else None)
    tpu.wait_dma2(window_memref(wm), window_memref(ws), window_memref(wd), device_id=device_id)
    return []



# ------------------------------------------------------------------------------------------
# TPU value primitives.


def _packed_bits(aval) -> int:
    """The element width of a vector of ``aval`` when narrower than 32 bits (a packed
    type: bf16, fp8, 16/8/4-bit integers), else 0. Bools (``i1`` masks) are not packed."""
    dt = jnp.dtype(aval.dtype)
    if not aval.shape or dt == jnp.bool_:
        return 0
    bits = int_bits(dt) if kind(dt) in "iu" else T.memory_dtype(dt).itemsize * 8
    return bits if bits < 32 else 0


@rule(tpu_vector.roll_p)
def _roll(lctx, eqn, x, shift):
    """``tpu.dynamic_rotate``. A strided rotation of a packed type (bf16, int8, ...) is
    done on its bits widened to i32 and narrowed back: libtpu up to its build of
    2026-06-17 (libtpu 0.0.42.1) rejects it on every chip ("Not implemented: unsupported
    packed type rotation"; upstream's lowering, which emits the packed rotation, fails
    alike, and upstream's test skips on such a libtpu). The widening moves whole
    elements, so the result is bit-exact; a rotation without a stride stays packed."""
    aval = aval_in(eqn, 0)
    v = materialize(x, aval)
    p = eqn.params
    amount = to_i32(materialize(shift, aval_in(eqn, 1)))
    bits = _packed_bits(aval) if p["stride"] is not None else 0
    if not bits:
        return tpu.dynamic_rotate(v, amount, p["axis"], stride=p["stride"],
                                  stride_dimension=p["stride_axis"])
    vshape = ir.VectorType(v.type).shape
    int_t = ir.VectorType.get(vshape, ir.IntegerType.get_signless(bits))
    as_int = v if v.type == int_t else arith.bitcast(int_t, v)
    wide = arith.extui(ir.VectorType.get(vshape, ir.IntegerType.get_signless(32)), as_int)
    wide = tpu.dynamic_rotate(wide, amount, p["axis"], stride=p["stride"],
                              stride_dimension=p["stride_axis"])
    narrow = arith.trunci(int_t, wide)
    return narrow if v.type == int_t else arith.bitcast(v.type, narrow)


@rule(tpu_vector.bitcast_p)
def _bitcast(lctx, eqn, x):
    src = aval_in(eqn, 0)
    if not src.shape:
        return arith.bitcast(T.aval_type(aval_out(eqn)), materialize(x, src))
    return tpu.bitcast(T.aval_type(aval_out(eqn)), materialize(x, src))


@rule(tpu_vector.pack_elementwise_p)
def _pack(lctx, eqn, *xs):
    vals = [materialize(x, aval_in(eqn, i)) for i, x in enumerate(xs)]
    return tpu.pack_elementwise(T.aval_type(aval_out(eqn)), vals,
                                T.elem_type(eqn.params["packed_dtype"]))


@rule(tpu_vector.unpack_elementwise_p)
def _unpack(lctx, eqn, x):
    return tpu.unpack_elementwise(T.aval_type(aval_out(eqn)), materialize(x, aval_in(eqn, 0)),
                                  T.elem_type(eqn.params["packed_dtype"]),
                                  eqn.params["index"])


@rule(tpu_vector.stochastic_round_p)
def _stochastic_round(lctx, eqn, x, bits):
    target = jnp.dtype(eqn.params["target_dtype"])
    if target == jnp.float16:
        # f16 values live in f32 in kernels, and Mosaic converts stochastically to bf16
        # and the 8-bit floats only ("Unsupported dtype for stochastic convert").
        raise NotImplementedError(
            "stochastic_round to float16 has no Mosaic TPU lowering (bfloat16 has); it "
            "runs under interpret=True")
    return tpu.stochastic_convert(T.aval_type(aval_out(eqn)), materialize(x, aval_in(eqn, 0)),
                                  materialize(bits, aval_in(eqn, 1)))


@rule(misc.prng_seed_p)
def _prng_seed(lctx, eqn, *seeds):
    tpu.prng_set_seed_32([to_i32(materialize(s, aval_in(eqn, i)))
                          for i, s in enumerate(seeds)])
    return []


@rule(misc.prng_random_bits_p)
def _prng_bits(lctx, eqn):
    return tpu.prng_random_bits(T.aval_type(aval_out(eqn)))


@rule(misc.trace_value_p)
def _trace_value(lctx, eqn, x):
    tpu.trace_value(materialize(x, aval_in(eqn, 0)), eqn.params["label"])
    return []


@rule(misc.get_barrier_semaphore_p)
def _get_barrier_semaphore(lctx, eqn):
    t = ir.MemRefType.get([], ir.Type.parse("!tpu.semaphore"),
                          memory_space=T.memory_space_attr(MemorySpace.SEMAPHORE))
    return RefVal(tpu.sem_barrier(t), jnp.int32, SemaphoreType.BARRIER, ())


@rule(misc.core_barrier_p)
def _core_barrier(lctx, eqn, sem, *idx):
    p = eqn.params
    n, name = p["num_cores"], p["axis_name"]
    if n <= 1:
        return []
    if name not in lctx.grid_names:
        raise NotImplementedError(
            f"core_barrier over axis {name!r}, which is not a core axis of this kernel "
            f"(its axes: {lctx.grid_names}); use the axis of pltpu.create_tensorcore_mesh"
        )
    me = to_i32(lctx.grid_indices[lctx.grid_names.index(name)])
    view = _sem_view(sem, idx, p["tree"])
    for core in range(n):  # signal every other core
        other = cmpi(arith.CmpIPredicate.ne, me, to_i32(core))
        op = scf.IfOp(other, [], has_else=False)
        with ir.InsertionPoint(op.then_block):
            tpu.sem_signal(view, to_i32(1), core_id=to_i32(core))
            scf.yield_([])
    tpu.sem_wait(view, to_i32(n - 1))
    return []


# ------------------------------------------------------------------------------------------
# Explicit MXU control.


def _i32_attr(v: int) -> ir.IntegerAttr:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(32), v)


@rule(mxu.matmul_push_rhs_p)
def _matmul_push_rhs(lctx, eqn, rhs):
    p = eqn.params
    tpu.matmul_push_rhs(materialize(rhs, aval_in(eqn, 0)), _i32_attr(p["mxu_index"]),
                        staging_register=_i32_attr(p["staging_register"]),
                        transpose=ir.BoolAttr.get(p["transpose"]))
    return []


@rule(mxu.matmul_acc_lhs_p)
def _matmul_acc_lhs(lctx, eqn, lhs):
    p = eqn.params
    load = p["load_staged_rhs"]
    tpu.matmul_acc_lhs(_i32_attr(p["acc_addr"]), materialize(lhs, aval_in(eqn, 0)),
                       _i32_attr(p["mxu_index"]),
                       load_staged_rhs=None if load is None else _i32_attr(load))
    return []


@rule(mxu.matmul_pop_p)
def _matmul_pop(lctx, eqn):
    p = eqn.params
    return tpu.matmul_pop(T.aval_type(aval_out(eqn)), _i32_attr(p["acc_addr"]),
                          _i32_attr(p["mxu_index"]))


@rule(misc.touch_p)
def _touch(lctx, eqn, *args):
    return []


def _register_debug_rules():
    prims = cc.debug_prims()
    if "debug_print_p" in prims:

        def _debug_print(lctx, eqn, *args):
            vals = [materialize(a, aval_in(eqn, i)) for i, a in enumerate(args)]
            fmt = eqn.params["fmt"]
            if any(isinstance(v.type, ir.VectorType) for v in vals):
                raise NotImplementedError("debug_print of vectors on Mosaic TPU (scalars only)")
            tpu.log(vals, fmt.replace("{}", "%d") if vals else fmt, formatted=bool(vals))
            return []

        rule(prims["debug_print_p"])(_debug_print)
    if "delay_p" in prims:

        def _delay(lctx, eqn, n):
            tpu.delay(to_i32(materialize(n, aval_in(eqn, 0))))
            return []

        rule(prims["delay_p"])(_delay)
    if "debug_check_p" in prims:
        rule(prims["debug_check_p"])(lambda lctx, eqn, *a: [])


_register_debug_rules()
