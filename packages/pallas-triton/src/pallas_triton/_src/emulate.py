"""The emulate level: the generated kernel runs under Triton's own interpreter, on CPU.

This is the very source text that :mod:`.compile` hands to ``triton.compile``, executed
by ``triton.runtime.interpreter`` (the machinery behind ``TRITON_INTERPRET=1``) over
NumPy buffers; no PyTorch is needed. Two things differ from a process started with
``TRITON_INTERPRET=1``, and both are scoped to one emulation: calls into Triton's own
``@triton.jit`` library functions (``tl.sum``, ``tl.argmax``, ...) are interpreted, and
``libdevice`` functions, which the interpreter lacks, are computed with NumPy.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from pallas_triton._src import module
from pallas_triton._src.codegen import tl_dtype
from pallas_triton._src.lowering import LoweredKernel

_lock = threading.RLock()


class _Storage:
    def __init__(self, arr: np.ndarray):
        self.arr = arr

    def data_ptr(self) -> int:
        return self.arr.ctypes.data

    def cpu(self):
        return self

    def copy_(self, other) -> None:
        pass  # host and "device" are the same buffer


class HostBuffer:
    """The tensor protocol Triton's interpreter expects, over a NumPy array (no torch)."""

    def __init__(self, arr: np.ndarray, dtype):
        self.arr = arr
        self.dtype = dtype  # a triton.language dtype

    def data_ptr(self) -> int:
        return self.arr.ctypes.data

    def untyped_storage(self) -> _Storage:
        return _Storage(self.arr)

    def storage_offset(self) -> int:
        return 0

    def size(self):
        return self.arr.shape

    def stride(self):
        return tuple(s // self.arr.itemsize for s in self.arr.strides)

    def new_empty(self, *args, **kwargs):
        return HostBuffer(self.arr, self.dtype)

    def set_(self, *args, **kwargs):
        return self

    def copy_(self, other) -> None:
        pass


# -- libdevice, for the interpreter ------------------------------------------------------


def _round_half_away(x):
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _clz(x):
    bits = x.dtype.itemsize * 8
    u = x.astype(np.uint64) & np.uint64((1 << bits) - 1)
    out = np.full(u.shape, bits, np.int64)
    for b in range(bits):
        out = np.where((u >> np.uint64(b)) & np.uint64(1), bits - 1 - b, out)
    return out.astype(x.dtype)


_NUMPY_LIBDEVICE = {
    "tan": np.tan, "tanh": np.tanh, "log1p": np.log1p, "expm1": np.expm1,
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh,
    "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "cbrt": np.cbrt, "pow": np.power, "atan2": np.arctan2, "nextafter": np.nextafter,
    "fmod": np.fmod, "rint": np.rint, "round": _round_half_away,
    "popc": lambda x: np.bitwise_count(x.view(f"u{x.dtype.itemsize}")).astype(x.dtype),
    "clz": _clz, "erfinv": lambda x: _special("erfinv", x),
    "erfc": lambda x: _special("erfc", x), "lgamma": lambda x: _special("gammaln", x),
}


def _special(name: str, x):
    """A function NumPy lacks, from ``jax.scipy.special`` (XLA's implementation)."""
    import jax.scipy.special

    return np.asarray(getattr(jax.scipy.special, name)(x))


class _InterpretedLibdevice:
    """``libdevice`` for the interpreter: each function computed by NumPy."""

    def __getattr__(self, name):
        fn = _NUMPY_LIBDEVICE.get(name)
        if fn is None:
            raise NotImplementedError(
                f"libdevice.{name} has no emulation in pallas-triton's interpreter mode")

        def apply(*args):
            import triton.language as tl
            from triton.runtime.interpreter import TensorHandle

            ref = next(a for a in args if isinstance(a, tl.tensor))
            datas = [a.handle.data if isinstance(a, tl.tensor) else np.asarray(a)
                     for a in args]
            with np.errstate(all="ignore"):
                out = np.asarray(fn(*datas)).astype(ref.handle.data.dtype)
            return tl.tensor(TensorHandle(out, ref.handle.dtype.scalar), ref.type)

        return apply


_interpreted = {}


def _call_interpreted(self, *args, **kwargs):
    from triton.runtime.interpreter import InterpretedFunction

    # The language is already patched for the interpreter by the running kernel's grid
    # executor (see ``interpreted_function``), and restored when it finishes.
    f = _interpreted.get(self.fn)
    if f is None:
        f = _interpreted[self.fn] = InterpretedFunction(self.fn).rewrite()
    return f(*args, **kwargs)


def _dot_in_f32(builder, original):
    """Triton 3.9's interpreter multiplies bf16 operands as their raw uint16 bits;
    widen them to f32 first (exact: every bf16 is an f32)."""
    import triton.language as tl

    def create_dot(a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16:
            a = builder.cast_impl(a, tl.float32)
        if b.dtype.scalar == tl.bfloat16:
            b = builder.cast_impl(b, tl.float32)
        return original(a, b, d, input_precision, max_num_imprecise_acc)

    return create_dot


def _rounding_cast(builder, original):
    """f32 -> bf16 rounds to nearest even, as the GPU does (the interpreter truncates)."""
    import ml_dtypes
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def cast_impl(src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            data = np.asarray(src.data, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
            return TensorHandle(data, dst_type.scalar)
        return original(src, dst_type)

    return cast_impl


def _fp8_rounding(builder, original):
    """Down-conversions to float8 (e4m3fn, e5m2) round to nearest even and saturate to
    the largest finite value, as the GPU's ``cvt.rn.satfinite`` does. Triton 3.9's
    interpreter adds the rounding bit to the mantissa without carrying it into the
    exponent (1.9 became 1.0, not 2.0)."""
    import ml_dtypes
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    wide = {tl.float32: (np.float32, np.float32), tl.float16: (np.float16, np.float16),
            tl.bfloat16: (np.uint16, ml_dtypes.bfloat16)}
    fp8 = {tl.float8e4nv: ml_dtypes.float8_e4m3fn, tl.float8e5: ml_dtypes.float8_e5m2}
    from triton._C.libtriton import ir as _ir

    def create_fp_to_fp(src, dst_type, rounding_mode):
        s, d = src.dtype.scalar, dst_type.scalar
        if s in wide and d in fp8 and rounding_mode in (None, _ir.ROUNDING_MODE.RTNE):
            store, real = wide[s]
            x = np.asarray(src.data, store).view(real).astype(np.float32)
            top = float(ml_dtypes.finfo(fp8[d]).max)
            x = np.where(np.isfinite(x), np.clip(x, -top, top), x)
            return TensorHandle(x.astype(fp8[d]).view(np.uint8), d)
        return original(src, dst_type, rounding_mode)

    return create_fp_to_fp


@contextlib.contextmanager
def interpreter_mode():
    """Scoped adjustments of Triton's interpreter for one emulation.

    ``@triton.jit`` library functions (``tl.sum``, ...) run interpreted, bf16
    ``tl.dot`` multiplies values rather than bit patterns, and f32 -> bf16 and
    conversions to float8 round to nearest even.
    """
    from triton.runtime import interpreter as ti
    from triton.runtime.jit import JITFunction

    with _lock:
        saved = JITFunction.__call__
        builder = ti.interpreter_builder
        JITFunction.__call__ = _call_interpreted
        builder.create_dot = _dot_in_f32(builder, type(builder).create_dot.__get__(builder))
        builder.cast_impl = _rounding_cast(builder, type(builder).cast_impl.__get__(builder))
        builder.create_fp_to_fp = _fp8_rounding(
            builder, type(builder).create_fp_to_fp.__get__(builder))
        try:
            yield
        finally:
            JITFunction.__call__ = saved
            del builder.create_dot
            del builder.cast_impl
            del builder.create_fp_to_fp


def interpreted_function(lowered: LoweredKernel):
    import triton.language.core as tl_core
    from triton.runtime.interpreter import InterpretedFunction

    # ``tl.core`` among the kernel's globals makes the interpreter patch (and restore)
    # it too, which Triton's own library functions call into.
    libdevice = _InterpretedLibdevice()
    # Device library calls made directly (``ocml_cbrt`` on AMD) are libdevice's too.
    externs = {name: getattr(libdevice, name.partition("_")[2]) for name in lowered.externs}
    jit_fn = module.load(lowered.source, lowered.name, variant="emulate",
                         overrides={"libdevice": libdevice, **externs,
                                    "_triton_language_core": tl_core})
    return InterpretedFunction(jit_fn.fn)


def emulate_lowered(lowered: LoweredKernel, *args) -> list[np.ndarray]:
    """Runs the kernel over ``args`` (scalar prefetch then inputs); returns the outputs."""
    import triton.language as tl  # noqa: F401 - Triton must be importable

    n_in = lowered.num_prefetch + lowered.num_inputs
    if len(args) != n_in:
        raise TypeError(f"kernel {lowered.name} takes {n_in} operands, got {len(args)}")
    bufs = []
    for a, aval in zip(args, lowered.operand_avals[:n_in]):
        arr = np.array(a, dtype=aval.dtype, copy=True, order="C")
        bufs.append(arr)
    aliases = dict((o, i) for i, o in lowered.input_output_aliases)
    outs = []
    for k, aval in enumerate(lowered.operand_avals[n_in:]):
        if k in aliases:
            outs.append(np.array(bufs[aliases[k]], copy=True, order="C"))
        else:
            outs.append(np.zeros(aval.shape, aval.dtype))
    tl_types = [_tl_type(a.dtype) for a in lowered.operand_avals]
    hosts = [HostBuffer(b, t) for b, t in zip([*bufs, *outs], tl_types)]
    fn = interpreted_function(lowered)
    with interpreter_mode():
        fn[lowered.launch_grid](*hosts)
    return outs


def _tl_type(dtype):
    import triton.language as tl

    return getattr(tl, tl_dtype(dtype).split(".", 1)[1])
