"""Dot and matmul inside kernels: dtypes, transposed operands (through dot_general
dimension numbers for every input dtype), preferred_element_type (through jnp.dot too),
batched dots, int8 x int8 -> int32, chained dots, a fused epilogue, and accumulation over
a grid axis (into the output or into scratch, a K-tiled grid with a transposed B)."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

import pallas as pl
from pallas_conformance.registry import Case, dtype_tags, randn, register, sds, short

M, K, N = 32, 64, 32
F32, BF16, F16, I8, I32 = jnp.float32, jnp.bfloat16, jnp.float16, jnp.int8, jnp.int32
HI = lax.Precision.HIGHEST

_TOL = {"float32": (1e-4, 1e-4), "bfloat16": (2e-2, 2e-2), "float16": (1e-2, 1e-2)}


def _gen(dtype, shape):
    def gen(rng):
        if jnp.issubdtype(dtype, jnp.integer):
            return jnp.asarray(rng.integers(-8, 8, size=shape), dtype)
        return randn(rng, shape, dtype, scale=0.5)

    return gen


def _dims(ta, tb):
    return (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))


def _dot_case(in_dtype, out_dtype, ta=False, tb=False, *, shape=(M, K, N), gen=_gen,
              tolerance=_TOL, general=False):
    """A dot_general of an (m, k) by a (k, n) operand, either transposed. ``general``
    cases are named and described by their contracting dimensions."""
    m, k, n = shape
    a_shape = (k, m) if ta else (m, k)
    b_shape = (n, k) if tb else (k, n)
    dims = _dims(ta, tb)

    def dot(a, b):
        return lax.dot_general(a, b, dims, precision=HI,
                               preferred_element_type=out_dtype).astype(out_dtype)

    def fn(pallas_call, a, b):
        def kernel(a_ref, b_ref, o_ref):
            o_ref[...] = dot(a_ref[...], b_ref[...])

        return pallas_call(kernel, out_shape=sds((m, n), out_dtype))(a, b)

    t = ("_tA" if ta else "") + ("_tB" if tb else "")
    what = f"dot_general {jnp.dtype(in_dtype).name} -> {jnp.dtype(out_dtype).name}"
    if general:
        what += f", contracting dims {dims[0]}"
    else:
        what += (" (A transposed)" if ta else "") + (" (B transposed)" if tb else "")
    ga, gb = gen(in_dtype, a_shape), gen(in_dtype, b_shape)
    register(Case(
        name=f"dot/{'general_' if general else ''}{short(in_dtype)}_to_{short(out_dtype)}{t}",
        fn=fn, inputs=lambda rng: (ga(rng), gb(rng)), reference=dot,
        tags=frozenset({"dot"} | dtype_tags(in_dtype, out_dtype)), tolerance=tolerance,
        description=what,
    ))


_dot_case(F32, F32)
_dot_case(F32, F32, ta=True)
_dot_case(F32, F32, tb=True)
_dot_case(F32, F32, ta=True, tb=True)
_dot_case(BF16, F32)
_dot_case(BF16, BF16)
_dot_case(BF16, F32, tb=True)
_dot_case(F16, F32)
_dot_case(F16, F16)
_dot_case(I8, I32)
_dot_case(I32, I32)


def _jnp_dot_fn(pallas_call, a, b):
    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...], precision=HI)

    return pallas_call(kernel, out_shape=sds((M, N), a.dtype))(a, b)


register(Case(name="dot/jnp_dot_f32", fn=_jnp_dot_fn,
              inputs=lambda rng: (randn(rng, (M, K)), randn(rng, (K, N))),
              reference=lambda a, b: jnp.dot(a, b, precision=HI), tags=frozenset({"dot"}),
              tolerance=_TOL, description="jnp.dot"))


def _matmul_op_fn(pallas_call, a, b):
    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = (a_ref[...] @ b_ref[...].T).astype(o_ref.dtype)

    return pallas_call(kernel, out_shape=sds((M, N), a.dtype))(a, b)


register(Case(name="dot/matmul_operator_bT_f32", fn=_matmul_op_fn,
              inputs=lambda rng: (randn(rng, (M, K)), randn(rng, (N, K))),
              reference=lambda a, b: jnp.matmul(a, b.T, precision=HI),
              tags=frozenset({"dot"}), tolerance=_TOL, description="a @ b.T"))


def _batched_fn(pallas_call, a, b):
    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.einsum("bmk,bkn->bmn", a_ref[...], b_ref[...], precision=HI)

    return pallas_call(kernel, out_shape=sds((2, 16, 16), a.dtype))(a, b)


register(Case(name="dot/batched_einsum_f32", fn=_batched_fn,
              inputs=lambda rng: (randn(rng, (2, 16, 32)), randn(rng, (2, 32, 16))),
              reference=lambda a, b: jnp.einsum("bmk,bkn->bmn", a, b, precision=HI),
              tags=frozenset({"dot"}), tolerance=_TOL, description="batched einsum"))


def _matvec_fn(pallas_call, a, v):
    def kernel(a_ref, v_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], v_ref[...], precision=HI)

    return pallas_call(kernel, out_shape=sds((M, 1), a.dtype))(a, v)


register(Case(name="dot/matrix_vector_f32", fn=_matvec_fn,
              inputs=lambda rng: (randn(rng, (M, K)), randn(rng, (K, 1))),
              reference=lambda a, v: jnp.dot(a, v, precision=HI), tags=frozenset({"dot"}),
              tolerance=_TOL, description="(M, K) @ (K, 1)"))


# The grid-accumulation cases: (16, 128) x (128, 128) block products (aligned to the
# (8, 128) tiles of TPU and fine for every backend) over a (2, 2, 4) grid.
GM, GK, GN, BM, BK, BN = 32, 512, 256, 16, 128, 128


def _acc_out_fn(dtype):
    def fn(pallas_call, a, b):
        def kernel(a_ref, b_ref, o_ref):
            @pl.when(pl.program_id(2) == 0)
            def _():
                o_ref[...] = jnp.zeros_like(o_ref)

            o_ref[...] += jnp.dot(a_ref[...], b_ref[...], precision=HI,
                                  preferred_element_type=jnp.float32)

        return pallas_call(
            kernel, out_shape=sds((GM, GN), jnp.float32), grid=(2, 2, 4),
            in_specs=[pl.BlockSpec((BM, BK), lambda i, j, k: (i, k)),
                      pl.BlockSpec((BK, BN), lambda i, j, k: (k, j))],
            out_specs=pl.BlockSpec((BM, BN), lambda i, j, k: (i, j)))(a, b)

    return fn


for _dt in (F32, BF16):
    register(Case(
        name=f"dot/accumulate_over_grid_into_output_{short(_dt)}", fn=_acc_out_fn(_dt),
        inputs=lambda rng, dt=_dt: (randn(rng, (GM, GK), dt, 0.5),
                                    randn(rng, (GK, GN), dt, 0.5)),
        reference=lambda a, b: jnp.dot(a, b, precision=HI, preferred_element_type=F32),
        tags=frozenset({"dot", "sequential_grid"} | dtype_tags(_dt)), tolerance=_TOL,
        description="accumulating a (2, 2, 4) grid of block products into the output",
    ))


def _acc_scratch_fn(pallas_call, a, b):
    n_k = GK // BK

    def kernel(a_ref, b_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == n_k - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    return pallas_call(
        kernel, out_shape=sds((GM, GN), a.dtype), grid=(2, 2, n_k),
        in_specs=[pl.BlockSpec((BM, BK), lambda i, j, k: (i, k)),
                  pl.BlockSpec((BK, BN), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((BM, BN), lambda i, j, k: (i, j)),
        scratch_shapes=[pl.ANY((BM, BN), jnp.float32)])(a, b)


register(Case(name="dot/accumulate_over_grid_in_scratch_bf16", fn=_acc_scratch_fn,
              inputs=lambda rng: (randn(rng, (GM, GK), BF16, 0.5),
                                  randn(rng, (GK, GN), BF16, 0.5)),
              reference=lambda a, b: jnp.dot(a, b, preferred_element_type=F32).astype(BF16),
              tags=frozenset({"dot", "scratch", "sequential_grid", "bf16"}), tolerance=_TOL,
              description="f32 scratch accumulator, bf16 output written on the last k step"))


# The cases below use (16, 128) x (128, 128) blocks unless a case says otherwise.
TM, TK, TN = 16, 128, 128

_TILED_TOL = {"float32": (1e-4, 1e-4), "bfloat16": (3e-2, 2e-2), "float16": (1e-2, 1e-2)}


def _tiled_gen(dtype, shape):
    def gen(rng):
        if jnp.issubdtype(dtype, jnp.integer):
            return jnp.asarray(rng.integers(-128 if dtype == I8 else -8, 128 if dtype == I8
                                            else 8, size=shape), dtype)
        return randn(rng, shape, dtype, scale=0.3)

    return gen


# dot_general cases named by their dimension numbers, on (8, 128)-tiled shapes.
_TILED = dict(shape=(TM, TK, TN), gen=_tiled_gen, tolerance=_TILED_TOL, general=True)
for _ta, _tb in ((False, False), (True, False), (False, True), (True, True)):
    _dot_case(I8, I32, _ta, _tb, **_TILED)
for _ta, _tb in ((True, False), (True, True)):
    _dot_case(BF16, F32, _ta, _tb, **_TILED)
_dot_case(F16, F32, False, True, **_TILED)
_dot_case(F16, F16, True, False, **_TILED)
_dot_case(BF16, BF16, False, True, **_TILED)


def _jnp_dot_preferred(in_dtype, out_dtype):
    def ref(a, b):
        return jnp.dot(a, b, precision=HI, preferred_element_type=out_dtype)

    def fn(pallas_call, a, b):
        def kernel(a_ref, b_ref, o_ref):
            o_ref[...] = ref(a_ref[...], b_ref[...])

        return pallas_call(kernel, out_shape=sds((TM, TN), out_dtype))(a, b)

    ga, gb = _tiled_gen(in_dtype, (TM, TK)), _tiled_gen(in_dtype, (TK, TN))
    register(Case(
        name=f"dot/jnp_dot_preferred_{short(in_dtype)}_to_{short(out_dtype)}", fn=fn,
        inputs=lambda rng: (ga(rng), gb(rng)), reference=ref,
        tags=frozenset({"dot"} | dtype_tags(in_dtype, out_dtype)), tolerance=_TILED_TOL,
        description=f"jnp.dot({jnp.dtype(in_dtype).name}, preferred_element_type="
                    f"{jnp.dtype(out_dtype).name})",
    ))


_jnp_dot_preferred(I8, I32)
_jnp_dot_preferred(BF16, F32)
_jnp_dot_preferred(F16, F32)


# TK-tiled accumulation of int8 products into an int32 output over a grid axis.
KT = 4 * TK


def _acc_i8_fn(pallas_call, a, b):
    def kernel(a_ref, b_ref, o_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=I32)

    return pallas_call(
        kernel, out_shape=sds((TM, TN), I32), grid=(2, KT // TK),
        in_specs=[pl.BlockSpec((8, TK), lambda i, k: (i, k)),
                  pl.BlockSpec((TK, TN), lambda i, k: (k, 0))],
        out_specs=pl.BlockSpec((8, TN), lambda i, k: (i, 0)))(a, b)


register(Case(
    name="dot/accumulate_over_grid_i8_to_i32", fn=_acc_i8_fn,
    inputs=lambda rng: (_tiled_gen(I8, (TM, KT))(rng), _tiled_gen(I8, (KT, TN))(rng)),
    reference=lambda a, b: jnp.dot(a, b, preferred_element_type=I32),
    tags=frozenset({"dot", "int8", "sequential_grid"}),
    description="int8 x int8 block products accumulated into an int32 output over K"))


def _acc_tb_fn(pallas_call, a, b):
    def kernel(a_ref, b_ref, o_ref, acc_ref):
        k = pl.program_id(1)

        @pl.when(k == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += lax.dot_general(a_ref[...], b_ref[...], _dims(False, True),
                                        precision=HI, preferred_element_type=F32)

        @pl.when(k == pl.num_programs(1) - 1)
        def _():
            o_ref[...] = acc_ref[...]

    return pallas_call(
        kernel, out_shape=sds((TM, TN), F32), grid=(2, KT // TK),
        in_specs=[pl.BlockSpec((8, TK), lambda i, k: (i, k)),
                  pl.BlockSpec((TN, TK), lambda i, k: (0, k))],
        out_specs=pl.BlockSpec((8, TN), lambda i, k: (i, 0)),
        scratch_shapes=[pl.ANY((8, TN), F32)])(a, b)


register(Case(
    name="dot/accumulate_over_grid_tB_f32", fn=_acc_tb_fn,
    inputs=lambda rng: (randn(rng, (TM, KT), scale=0.3), randn(rng, (TN, KT), scale=0.3)),
    reference=lambda a, b: jnp.dot(a, b.T, precision=HI),
    tags=frozenset({"dot", "scratch", "sequential_grid"}), tolerance=_TILED_TOL,
    description="a @ b.T with B tiled along K, accumulated in scratch over the K grid axis"))


def _batched_tb_fn(pallas_call, q, k):
    dims = (((2,), (2,)), ((0,), (0,)))

    def kernel(q_ref, k_ref, o_ref):
        o_ref[...] = lax.dot_general(q_ref[...], k_ref[...], dims, precision=HI)

    return pallas_call(kernel, out_shape=sds((2, TM, TN), q.dtype))(q, k)


register(Case(
    name="dot/batched_general_tB_f32", fn=_batched_tb_fn,
    inputs=lambda rng: (randn(rng, (2, TM, TK), scale=0.3), randn(rng, (2, TN, TK), scale=0.3)),
    reference=lambda q, k: jnp.einsum("bqd,bkd->bqk", q, k, precision=HI),
    tags=frozenset({"dot"}), tolerance=_TILED_TOL,
    description="batched dot_general with batch dims (0, 0) contracting the last axes"))


def _chained_fn(pallas_call, a, b, c):
    def kernel(a_ref, b_ref, c_ref, o_ref):
        t = jnp.dot(a_ref[...], b_ref[...], precision=HI)
        o_ref[...] = jnp.dot(t, c_ref[...], precision=HI)

    return pallas_call(kernel, out_shape=sds((TM, TN), a.dtype))(a, b, c)


register(Case(
    name="dot/chained_f32", fn=_chained_fn,
    inputs=lambda rng: (randn(rng, (TM, TK), scale=0.3), randn(rng, (TK, TK), scale=0.1),
                        randn(rng, (TK, TN), scale=0.3)),
    reference=lambda a, b, c: jnp.dot(jnp.dot(a, b, precision=HI), c, precision=HI),
    tags=frozenset({"dot"}), tolerance=_TILED_TOL,
    description="(a @ b) @ c: a dot result fed to a second dot"))


def _epilogue_fn(pallas_call, a, b, bias):
    def kernel(a_ref, b_ref, bias_ref, o_ref):
        acc = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=F32)
        o_ref[...] = jnp.maximum(acc + bias_ref[...], 0.0).astype(o_ref.dtype)

    spec_a = pl.BlockSpec((8, TK), lambda i: (i, 0))
    return pallas_call(kernel, out_shape=sds((TM, TN), BF16), grid=(2,),
                       in_specs=[spec_a, pl.BlockSpec((TK, TN), lambda i: (0, 0)),
                                 pl.BlockSpec((1, TN), lambda i: (0, 0))],
                       out_specs=pl.BlockSpec((8, TN), lambda i: (i, 0)))(a, b, bias)


register(Case(
    name="dot/bias_relu_epilogue_bf16", fn=_epilogue_fn,
    inputs=lambda rng: (randn(rng, (TM, TK), BF16, 0.3), randn(rng, (TK, TN), BF16, 0.3),
                        randn(rng, (1, TN))),
    reference=lambda a, b, bias: jnp.maximum(
        jnp.dot(a, b, preferred_element_type=F32) + bias, 0.0).astype(BF16),
    tags=frozenset({"dot", "bf16", "broadcasting"}), tolerance=_TILED_TOL,
    description="bf16 dot with f32 accumulation, a broadcast bias and relu, cast to bf16"))
