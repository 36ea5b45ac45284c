"""Dot and matmul inside kernels: dtypes, transposed operands, preferred_element_type,
batched dots, and accumulation over a grid axis (into the output or into scratch)."""

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


def _dot_case(in_dtype, out_dtype, ta=False, tb=False):
    a_shape = (K, M) if ta else (M, K)
    b_shape = (N, K) if tb else (K, N)
    dims = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))

    def reference(a, b):
        return lax.dot_general(a, b, dims, precision=HI,
                               preferred_element_type=out_dtype).astype(out_dtype)

    def fn(pallas_call, a, b):
        def kernel(a_ref, b_ref, o_ref):
            o_ref[...] = lax.dot_general(a_ref[...], b_ref[...], dims, precision=HI,
                                         preferred_element_type=out_dtype).astype(out_dtype)

        return pallas_call(kernel, out_shape=sds((M, N), out_dtype))(a, b)

    t = ("_tA" if ta else "") + ("_tB" if tb else "")
    ga, gb = _gen(in_dtype, a_shape), _gen(in_dtype, b_shape)
    register(Case(
        name=f"dot/{short(in_dtype)}_to_{short(out_dtype)}{t}", fn=fn,
        inputs=lambda rng: (ga(rng), gb(rng)), reference=reference,
        tags=frozenset({"dot"} | dtype_tags(in_dtype, out_dtype)), tolerance=_TOL,
        description=f"dot_general {jnp.dtype(in_dtype).name} -> {jnp.dtype(out_dtype).name}"
        + (" (A transposed)" if ta else "") + (" (B transposed)" if tb else ""),
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
