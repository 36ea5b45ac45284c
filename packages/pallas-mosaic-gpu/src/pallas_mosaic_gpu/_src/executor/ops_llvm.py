"""``llvm`` ops: pointers (int64 addresses), aggregates (tuples), loads/stores, allocas,
integer arithmetic, the inline assembly Mosaic GPU emits and libdevice calls."""

from __future__ import annotations

import numpy as np
import scipy.special
from jaxlib.mlir import ir

from pallas_mosaic_gpu._src.executor import ops_math, subbyte  # noqa: F401 - ops_math first
from pallas_mosaic_gpu._src.executor.engine import ASM_PATTERNS, OPS, asm, int_array_attr, op
from pallas_mosaic_gpu._src.executor.types import (
    EmulationUnsupported,
    dtype_of,
    llvm_layout,
    undef_of,
    vshape,
)

# LLVM's integer ops are arith's (this backend's: its division by zero, ops_math).
for _llvm, _arith in {"add": "addi", "sub": "subi", "mul": "muli", "and": "andi",
                      "or": "ori", "xor": "xori", "shl": "shli", "lshr": "shrui",
                      "ashr": "shrsi", "udiv": "divui", "sdiv": "divsi", "urem": "remui",
                      "srem": "remsi", "zext": "extui", "sext": "extsi",
                      "trunc": "trunci", "fadd": "addf", "fsub": "subf", "fmul": "mulf",
                      "fdiv": "divf", "select": "select"}.items():
    OPS.register(f"llvm.{_llvm}", owner="pallas_mosaic_gpu")(OPS[f"arith.{_arith}"])
OPS.register("llvm.mlir.constant", owner="pallas_mosaic_gpu")(OPS["arith.constant"])


@op("llvm.ptrtoint", "llvm.inttoptr", "llvm.addrspacecast")
def _ptr_cast(o, cc):
    dt = dtype_of(o.results[0].type)

    def run(m, x):
        return (np.asarray(x).astype(dt),)

    return run


@op("llvm.bitcast")
def _llvm_bitcast(o, cc):
    """Pointers stay addresses; other values keep their bits (f32 <-> i32, vectors)."""
    t = o.results[0].type
    if str(t).startswith("!llvm.ptr"):
        return _ptr_cast(o, cc)
    dt, shape = dtype_of(t), vshape(t)

    def run(m, x):
        return (subbyte.bitcast(x, dt, shape),)

    return run


_GEP_DYNAMIC = -2147483648


@op("llvm.getelementptr")
def _gep(o, cc):
    raw = int_array_attr(o.attributes["rawConstantIndices"])
    elem = str(ir.TypeAttr(o.attributes["elem_type"]).value)

    def run(m, base, *dyn):
        dyn = iter(dyn)
        addr = np.asarray(base, np.int64)
        t = elem
        for k, r in enumerate(raw):
            idx = np.asarray(next(dyn), np.int64) if r == _GEP_DYNAMIC else r
            if k == 0:
                addr = addr + idx * llvm_layout(t)[0]
                continue
            _, _, kind, parts = llvm_layout(t)
            if kind == "array":
                t = parts[1]
                addr = addr + idx * llvm_layout(t)[0]
            elif kind == "struct":
                off, t = parts[int(idx)]
                addr = addr + off
            else:
                raise EmulationUnsupported(f"llvm.getelementptr into {t}")
        return (addr,)

    return run


def _read(m, addr, t: str):
    _, _, kind, parts = llvm_layout(t)
    if kind == "scalar":
        return m.memory.gather(addr, parts, m.mask)
    if kind == "vector" and subbyte.is_int4(parts[1]):  # two elements a byte
        n, dt = parts
        addrs = np.asarray(addr, np.int64)[:, None] + np.arange(n // 2)
        data = m.memory.gather(addrs, np.uint8, None if m.mask is None else m.mask[:, None])
        return subbyte.unpack(data, dt)
    if kind == "vector" or (kind == "array" and llvm_layout(parts[1])[2] == "scalar"):
        n, elem = parts
        dt = elem if kind == "vector" else llvm_layout(elem)[3]
        addrs = np.asarray(addr, np.int64)[:, None] + np.arange(n) * dt.itemsize
        return m.memory.gather(addrs, dt, None if m.mask is None else m.mask[:, None])
    raise EmulationUnsupported(f"llvm.load of {t}")


@op("llvm.load")
def _load(o, cc):
    t = str(o.results[0].type)

    def run(m, addr):
        return (_read(m, addr, t),)

    return run


@op("llvm.store")
def _store(o, cc):
    t = str(o.operands[0].type)
    _, _, kind, parts = llvm_layout(t)

    def run(m, v, addr):
        if kind == "scalar":
            m.memory.scatter(addr, np.asarray(v, parts), m.mask)
        elif kind == "vector" and subbyte.is_int4(parts[1]):  # two elements a byte
            addrs = np.asarray(addr, np.int64)[:, None] + np.arange(parts[0] // 2)
            m.memory.scatter(addrs, subbyte.pack(np.asarray(v, parts[1])),
                             None if m.mask is None else m.mask[:, None])
        elif kind in ("array", "vector"):
            n, elem = parts
            dt = elem if kind == "vector" else llvm_layout(elem)[3]
            addrs = np.asarray(addr, np.int64)[:, None] + np.arange(n) * dt.itemsize
            m.memory.scatter(addrs, np.asarray(v, dt),
                             None if m.mask is None else m.mask[:, None])
        else:
            raise EmulationUnsupported(f"llvm.store of {t}")

    return run


@op("llvm.alloca")
def _alloca(o, cc):
    elem = str(ir.TypeAttr(o.attributes["elem_type"]).value)
    size = llvm_layout(elem)[0]

    def run(m, count):
        n = int(np.asarray(count).reshape(-1)[0]) * size
        lanes = m.threads
        base = m.memory.alloc(max(n, 1) * lanes, "llvm.alloca")
        return (base + np.arange(lanes, dtype=np.int64) * max(n, 1),)

    return run


@op("llvm.mlir.undef", "llvm.mlir.poison", "llvm.mlir.zero")
def _undef(o, cc):
    t = str(o.results[0].type)
    rt = o.results[0].type
    if isinstance(rt, ir.VectorType) or not t.startswith("!llvm."):
        v = np.zeros((1,) + vshape(rt), dtype_of(rt))
    else:
        v = undef_of(t)
    if v is None:
        v = np.zeros(1, llvm_layout(t)[3])

    def run(m):
        return (v,)

    return run


def _set(agg, pos, x):
    if isinstance(agg, tuple):
        agg = list(agg)
        agg[pos[0]] = x if len(pos) == 1 else _set(agg[pos[0]], pos[1:], x)
        return tuple(agg)
    agg = np.asarray(agg)  # an array of scalars: (lanes, n)
    n = max(agg.shape[0], np.asarray(x).shape[0])
    out = np.array(np.broadcast_to(agg, (n,) + agg.shape[1:]))
    out[:, pos[0]] = np.asarray(x).reshape(-1)
    return out


def _get(agg, pos):
    for p in pos:
        agg = agg[p] if isinstance(agg, tuple) else np.asarray(agg)[:, p]
    return agg


@op("llvm.insertvalue")
def _insertvalue(o, cc):
    pos = int_array_attr(o.attributes["position"])

    def run(m, agg, x):
        return (_set(agg, pos, x),)

    return run


@op("llvm.extractvalue")
def _extractvalue(o, cc):
    pos = int_array_attr(o.attributes["position"])

    def run(m, agg):
        return (_get(agg, pos),)

    return run


def _named_barrier(m, bar, count):
    """``bar.sync id, n``: the active threads arrive at named barrier ``id``, which
    releases once ``n`` threads of the block have arrived."""
    bar = int(np.asarray(bar).reshape(-1)[0]) if bar is not None else 0
    m.block.barrier(m, bar, count, f"named barrier {bar} (bar.sync)")


_ASM = {
    "max.NaN.f32 $0, $1, $2;": lambda m, a, b: np.maximum(a, b),
    "min.NaN.f32 $0, $1, $2;": lambda m, a, b: np.minimum(a, b),
    # CompilerParams(approx_math=True); the hardware's approximation is within 2 ulp.
    "ex2.approx.ftz.f32 $0, $1;": lambda m, a: np.exp2(np.asarray(a, np.float32)),
}


@asm(r"bar\.sync \$0, (\d+);")
def _bar_sync(o, match):
    count = int(match.group(1))
    return lambda m, bar: _named_barrier(m, bar, count)


@asm(r"")
def _register_barrier(o, match):
    """An empty statement whose outputs are tied to its inputs (Mosaic GPU's
    optimisation barrier): the outputs are the inputs."""
    cons = ir.StringAttr(o.attributes["constraints"]).value.split(",")
    nout = sum(c.startswith("=") for c in cons)
    ties = [cons.index(str(j)) - nout if str(j) in cons else None for j in range(nout)]
    if None in ties:
        raise EmulationUnsupported(f"an empty inline asm with untied outputs ({cons})")

    def run(m, *xs):
        outs = tuple(xs[t] for t in ties)
        return (outs if nout > 1 else outs[0],)

    return run


@op("llvm.inline_asm")
def _inline_asm(o, cc):
    text = ir.StringAttr(o.attributes["asm_string"]).value
    has_result = len(o.results) and str(o.results[0].type) != "!llvm.void"
    f = _ASM.get(text)
    if f is None:
        for pattern, builder in ASM_PATTERNS:
            match = pattern.fullmatch(text.strip())
            if match:
                fn = builder(o, match)
                if not len(o.results):
                    return lambda m, *xs: (fn(m, *xs), None)[1]
                if not has_result:
                    return lambda m, *xs: (fn(m, *xs), (None,))[1]
                return fn
        raise EmulationUnsupported(f"the Mosaic GPU executor does not implement inline "
                                   f"PTX {text!r}")
    dt = dtype_of(o.results[0].type) if has_result else None

    def run(m, *xs):
        r = f(m, *xs)
        return (np.asarray(r, dt) if has_result else None,) if len(o.results) else None

    return run


# libdevice functions reached through ``llvm.call`` (name -> numpy function).
LIBDEVICE = {
    "__nv_lgammaf": scipy.special.gammaln,
    "__nv_fmodf": np.fmod,
    "__nv_expf": np.exp,
    "__nv_logf": np.log,
    "__nv_powf": np.power,
    "__nv_erfinvf": scipy.special.erfinv,
}


@op("llvm.call")
def _call(o, cc):
    callee = ir.FlatSymbolRefAttr(o.attributes["callee"]).value
    f = LIBDEVICE.get(callee)
    if f is None:
        raise EmulationUnsupported(f"the Mosaic GPU executor does not implement a call to "
                                   f"{callee}")
    dt = dtype_of(o.results[0].type)

    def run(m, *xs):
        with np.errstate(all="ignore"):
            return (np.asarray(f(*[np.asarray(x, np.float32) for x in xs])).astype(dt),)

    return run

