"""More dots: transposes through dot_general dimension numbers for every input dtype,
int8 x int8 -> int32 with transposes and accumulation over a grid axis,
preferred_element_type through jnp.dot, batched dot_general with a transposed operand,
chained dots, a fused epilogue, and a K-tiled grid with a transposed B.

Shapes are (8, 128)-tiled: (16, 128) x (128, 128) blocks unless a case says otherwise.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

import pallas as pl
from pallas_conformance.registry import Case, dtype_tags, randn, register, sds, short

M, K, N = 16, 128, 128
F32, BF16, F16, I8, I32 = jnp.float32, jnp.bfloat16, jnp.float16, jnp.int8, jnp.int32
HI = lax.Precision.HIGHEST

_TOL = {"float32": (1e-4, 1e-4), "bfloat16": (3e-2, 2e-2), "float16": (1e-2, 1e-2)}


def _gen(dtype, shape):
    def gen(rng):
        if jnp.issubdtype(dtype, jnp.integer):
            return jnp.asarray(rng.integers(-128 if dtype == I8 else -8, 128 if dtype == I8
                                            else 8, size=shape), dtype)
        return randn(rng, shape, dtype, scale=0.3)

    return gen


def _dims(ta, tb):
    return (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))


def _dot_general_case(in_dtype, out_dtype, ta, tb):
    a_shape = (K, M) if ta else (M, K)
    b_shape = (N, K) if tb else (K, N)
    dims = _dims(ta, tb)

    def dot(a, b):
        return lax.dot_general(a, b, dims, precision=HI,
                               preferred_element_type=out_dtype).astype(out_dtype)

    def fn(pallas_call, a, b):
        def kernel(a_ref, b_ref, o_ref):
            o_ref[...] = dot(a_ref[...], b_ref[...])

        return pallas_call(kernel, out_shape=sds((M, N), out_dtype))(a, b)

    t = ("_tA" if ta else "") + ("_tB" if tb else "")
    ga, gb = _gen(in_dtype, a_shape), _gen(in_dtype, b_shape)
    register(Case(
        name=f"dot/general_{short(in_dtype)}_to_{short(out_dtype)}{t}", fn=fn,
        inputs=lambda rng: (ga(rng), gb(rng)), reference=dot,
        tags=frozenset({"dot"} | dtype_tags(in_dtype, out_dtype)), tolerance=_TOL,
        description=f"dot_general {jnp.dtype(in_dtype).name} -> "
                    f"{jnp.dtype(out_dtype).name}, contracting dims {dims[0]}",
    ))


for _ta, _tb in ((False, False), (True, False), (False, True), (True, True)):
    _dot_general_case(I8, I32, _ta, _tb)
for _ta, _tb in ((True, False), (True, True)):
    _dot_general_case(BF16, F32, _ta, _tb)
_dot_general_case(F16, F32, False, True)
_dot_general_case(F16, F16, True, False)
_dot_general_case(BF16, BF16, False, True)


def _jnp_dot_preferred(in_dtype, out_dtype):
    def ref(a, b):
        return jnp.dot(a, b, precision=HI, preferred_element_type=out_dtype)

    def fn(pallas_call, a, b):
        def kernel(a_ref, b_ref, o_ref):
            o_ref[...] = ref(a_ref[...], b_ref[...])

        return pallas_call(kernel, out_shape=sds((M, N), out_dtype))(a, b)

    ga, gb = _gen(in_dtype, (M, K)), _gen(in_dtype, (K, N))
    register(Case(
        name=f"dot/jnp_dot_preferred_{short(in_dtype)}_to_{short(out_dtype)}", fn=fn,
        inputs=lambda rng: (ga(rng), gb(rng)), reference=ref,
        tags=frozenset({"dot"} | dtype_tags(in_dtype, out_dtype)), tolerance=_TOL,
        description=f"jnp.dot({jnp.dtype(in_dtype).name}, preferred_element_type="
                    f"{jnp.dtype(out_dtype).name})",
    ))


_jnp_dot_preferred(I8, I32)
_jnp_dot_preferred(BF16, F32)
_jnp_dot_preferred(F16, F32)


# K-tiled accumulation of int8 products into an int32 output over a grid axis.
KT = 4 * K


def _acc_i8_fn(pallas_call, a, b):
    def kernel(a_ref, b_ref, o_ref):
        @pl.when(pl.program_id(1) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=I32)

    return pallas_call(
        kernel, out_shape=sds((M, N), I32), grid=(2, KT // K),
        in_specs=[pl.BlockSpec((8, K), lambda i, k: (i, k)),
                  pl.BlockSpec((K, N), lambda i, k: (k, 0))],
        out_specs=pl.BlockSpec((8, N), lambda i, k: (i, 0)))(a, b)


register(Case(
    name="dot/accumulate_over_grid_i8_to_i32", fn=_acc_i8_fn,
    inputs=lambda rng: (_gen(I8, (M, KT))(rng), _gen(I8, (KT, N))(rng)),
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
        kernel, out_shape=sds((M, N), F32), grid=(2, KT // K),
        in_specs=[pl.BlockSpec((8, K), lambda i, k: (i, k)),
                  pl.BlockSpec((N, K), lambda i, k: (0, k))],
        out_specs=pl.BlockSpec((8, N), lambda i, k: (i, 0)),
        scratch_shapes=[pl.ANY((8, N), F32)])(a, b)


register(Case(
    name="dot/accumulate_over_grid_tB_f32", fn=_acc_tb_fn,
    inputs=lambda rng: (randn(rng, (M, KT), scale=0.3), randn(rng, (N, KT), scale=0.3)),
    reference=lambda a, b: jnp.dot(a, b.T, precision=HI),
    tags=frozenset({"dot", "scratch", "sequential_grid"}), tolerance=_TOL,
    description="a @ b.T with B tiled along K, accumulated in scratch over the K grid axis"))


def _batched_tb_fn(pallas_call, q, k):
    dims = (((2,), (2,)), ((0,), (0,)))

    def kernel(q_ref, k_ref, o_ref):
        o_ref[...] = lax.dot_general(q_ref[...], k_ref[...], dims, precision=HI)

    return pallas_call(kernel, out_shape=sds((2, M, N), q.dtype))(q, k)


register(Case(
    name="dot/batched_general_tB_f32", fn=_batched_tb_fn,
    inputs=lambda rng: (randn(rng, (2, M, K), scale=0.3), randn(rng, (2, N, K), scale=0.3)),
    reference=lambda q, k: jnp.einsum("bqd,bkd->bqk", q, k, precision=HI),
    tags=frozenset({"dot"}), tolerance=_TOL,
    description="batched dot_general with batch dims (0, 0) contracting the last axes"))


def _chained_fn(pallas_call, a, b, c):
    def kernel(a_ref, b_ref, c_ref, o_ref):
        t = jnp.dot(a_ref[...], b_ref[...], precision=HI)
        o_ref[...] = jnp.dot(t, c_ref[...], precision=HI)

    return pallas_call(kernel, out_shape=sds((M, N), a.dtype))(a, b, c)


register(Case(
    name="dot/chained_f32", fn=_chained_fn,
    inputs=lambda rng: (randn(rng, (M, K), scale=0.3), randn(rng, (K, K), scale=0.1),
                        randn(rng, (K, N), scale=0.3)),
    reference=lambda a, b, c: jnp.dot(jnp.dot(a, b, precision=HI), c, precision=HI),
    tags=frozenset({"dot"}), tolerance=_TOL,
    description="(a @ b) @ c: a dot result fed to a second dot"))


def _epilogue_fn(pallas_call, a, b, bias):
    def kernel(a_ref, b_ref, bias_ref, o_ref):
        acc = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=F32)
        o_ref[...] = jnp.maximum(acc + bias_ref[...], 0.0).astype(o_ref.dtype)

    spec_a = pl.BlockSpec((8, K), lambda i: (i, 0))
    return pallas_call(kernel, out_shape=sds((M, N), BF16), grid=(2,),
                       in_specs=[spec_a, pl.BlockSpec((K, N), lambda i: (0, 0)),
                                 pl.BlockSpec((1, N), lambda i: (0, 0))],
                       out_specs=pl.BlockSpec((8, N), lambda i: (i, 0)))(a, b, bias)


register(Case(
    name="dot/bias_relu_epilogue_bf16", fn=_epilogue_fn,
    inputs=lambda rng: (randn(rng, (M, K), BF16, 0.3), randn(rng, (K, N), BF16, 0.3),
                        randn(rng, (1, N))),
    reference=lambda a, b, bias: jnp.maximum(
        jnp.dot(a, b, preferred_element_type=F32) + bias, 0.0).astype(BF16),
    tags=frozenset({"dot", "bf16", "broadcasting"}), tolerance=_TOL,
    description="bf16 dot with f32 accumulation, a broadcast bias and relu, cast to bf16"))
