"""Upstream's kernel library (``jax.experimental.pallas.ops``) run unchanged on our packages.

For every kernel and shape below, two subprocesses run the same upstream source:

* **ours**: upstream's name mapping (``../shared/tools/upstream_shim``) is installed
  first, so ``jax.experimental.pallas`` is this project's ``pallas`` (and ``pallas_tpu``,
  ``pallas_triton``), with upstream's implementation blocked;
* **upstream**: plain JAX 0.10.2, upstream Pallas itself.

Each reports the **numbers** level (interpret mode, the kernel's own ``interpret`` flag
or ``pltpu.force_tpu_interpret_mode()``, against the reference shipped beside the
kernel, forward and where shipped backward; median time of 3 runs after a warm-up) and
the **lower** level (GPU kernels: ``lowering_platforms=("cuda",)``, which on our side
lowers with ``triton``; TPU kernels: ``("tpu",)``, a ``tpu_custom_call``). The table
says ``ok``, ``FAIL`` (wrong numbers) or the first line of the error.

    python benchmarks/upstream_ops.py                 # everything (several minutes)
    python benchmarks/upstream_ops.py -k softmax      # kernels whose name contains this
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIM = os.path.join(ROOT, "..", "shared", "tools", "upstream_shim", "conftest.py")


# ------------------------------------------------------------------------------------
# The kernels: name -> (shapes, run(shape, interpret) -> (fn, args, reference, platform)).


def _keys(n):
    import jax

    return jax.random.split(jax.random.key(0), n)


def gpu_softmax(shape):
    import jax
    from jax.experimental.pallas.ops.gpu import softmax

    x = jax.random.normal(_keys(1)[0], shape)
    return (lambda x, interpret: softmax.softmax(x, axis=-1, interpret=interpret),
            (x,), lambda x: jax.nn.softmax(x, axis=-1), "cuda")


def gpu_norm(shape, module="layer_norm", grad=False):
    """Upstream's GPU layer norm or RMS norm (same signature and reference shape)."""
    import importlib

    import jax
    import jax.numpy as jnp

    mod = importlib.import_module(f"jax.experimental.pallas.ops.gpu.{module}")
    k1, k2, k3 = _keys(3)
    x = jax.random.normal(k1, shape)
    w, b = jax.random.normal(k2, shape[-1:]), jax.random.normal(k3, shape[-1:])

    def f(x, w, b, interpret):
        return getattr(mod, module)(x, w, b, interpret=interpret)

    ref = getattr(mod, f"{module}_reference")
    if grad:
        loss = lambda g: lambda x, w, b: jnp.sum(g(x, w, b) ** 2)  # noqa: E731
        return (lambda x, w, b, interpret: jax.grad(
                    loss(lambda *a: f(*a, interpret)), argnums=(0, 1, 2))(x, w, b),
                (x, w, b), jax.grad(loss(ref), argnums=(0, 1, 2)), "cuda")
    return f, (x, w, b), ref, "cuda"


def gpu_attention(shape, grad=False):
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import attention

    b, s, h, d = shape
    q, k, v = (jax.random.normal(key, shape) * 0.5 for key in _keys(3))
    bs = attention.BlockSizes(block_q=64, block_k=64, block_q_dkv=32, block_kv_dkv=32,
                              block_q_dq=32, block_kv_dq=32)

    def f(q, k, v, interpret):
        return attention.mha(q, k, v, None, causal=True, block_sizes=bs,
                             interpret=interpret)

    def ref(q, k, v):
        return attention.mha_reference(q, k, v, None, causal=True)

    if grad:
        loss = lambda g: lambda q, k, v: jnp.sum(g(q, k, v) ** 2)  # noqa: E731
        return (lambda q, k, v, interpret: jax.grad(
                    loss(lambda *a: f(*a, interpret)), argnums=(0, 1, 2))(q, k, v),
                (q, k, v), jax.grad(loss(ref), argnums=(0, 1, 2)), "cuda")
    return f, (q, k, v), ref, "cuda"


def gpu_decode_attention(shape, kind="mqa"):
    import jax
    from jax.experimental.pallas.ops.gpu import decode_attention as da

    b, h, hk, s, d = shape
    k1, k2, k3 = _keys(3)
    if kind == "mqa":
        q = jax.random.normal(k1, (b, h, d))
        k = jax.random.normal(k2, (b, s, d))
        v = jax.random.normal(k3, (b, s, d))
        return (lambda q, k, v, interpret: da.mqa(q, k, v, block_k=64, interpret=interpret),
                (q, k, v), da.mqa_reference, "cuda")
    q = jax.random.normal(k1, (b, h, d))
    k = jax.random.normal(k2, (b, s, hk, d))
    v = jax.random.normal(k3, (b, s, hk, d))
    return (lambda q, k, v, interpret: da.gqa(q, k, v, block_k=64, interpret=interpret),
            (q, k, v), da.gqa_reference, "cuda")


def tpu_flash_attention(shape, grad=False):
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    q, k, v = (jax.random.normal(key, shape) * 0.5 for key in _keys(3))
    bs = fa.BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1,
                       block_q_major_dkv=128, block_k_major_dkv=128, block_k_dkv=128,
                       block_q_dkv=128, block_k_major_dq=128, block_k_dq=128,
                       block_q_dq=128)

    def f(q, k, v, interpret):
        del interpret  # forced by the worker
        return fa.flash_attention(q, k, v, causal=True, block_sizes=bs)

    def ref(q, k, v):
        return fa.mha_reference(q, k, v, None, causal=True)

    if grad:
        loss = lambda g: lambda q, k, v: jnp.sum(g(q, k, v) ** 2)  # noqa: E731
        return (lambda q, k, v, interpret: jax.grad(
                    loss(lambda *a: f(*a, interpret)), argnums=(0, 1, 2))(q, k, v),
                (q, k, v), jax.grad(loss(ref), argnums=(0, 1, 2)), "tpu")
    return f, (q, k, v), ref, "tpu"


def tpu_matmul(shape):
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu import matmul

    m, k, n = shape
    k1, k2 = _keys(2)
    x, y = jax.random.normal(k1, (m, k)), jax.random.normal(k2, (k, n))
    return (lambda x, y, interpret: matmul.matmul(x, y, block_shape=(128, 128)),
            (x, y), lambda x, y: jnp.dot(x, y, precision="highest"), "tpu")


def tpu_splash_attention(shape, grad=False, mask="causal"):
    """Splash attention (multi-head, one mask per head) against the reference shipped
    beside it, forward and (``grad``) the splash backward kernels (dq, dkv)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as sk,
    )
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_mask as sm,
    )

    h, s, d = shape
    if mask == "causal":
        head = sm.CausalMask((s, s))
    else:  # a local (sliding-window) mask
        head = sm.LocalMask((s, s), window_size=(64, 0), offset=0)
    masks = sm.MultiHeadMask([head] * h)
    b = 128
    bs = sk.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b,
                       block_kv_dkv=b, block_kv_dkv_compute=b, block_q_dq=b,
                       block_kv_dq=b)
    q, k, v = (jax.random.normal(key, shape) * 0.5 for key in _keys(3))
    dense = jnp.asarray(np.stack([head[:, :]] * h))
    ref_fn = sk.make_attention_reference(dense, is_mqa=False)

    def f(q, k, v, interpret):
        kernel = sk.make_splash_mha(masks, block_sizes=bs, head_shards=1,
                                    q_seq_shards=1, interpret=interpret)
        return kernel(q, k, v)

    def ref(q, k, v):
        return ref_fn(q, k, v)

    if grad:
        loss = lambda g: lambda q, k, v: jnp.sum(g(q, k, v) ** 2)  # noqa: E731
        return (lambda q, k, v, interpret: jax.grad(
                    loss(lambda *a: f(*a, interpret)), argnums=(0, 1, 2))(q, k, v),
                (q, k, v), jax.grad(loss(ref), argnums=(0, 1, 2)), "tpu")
    return f, (q, k, v), ref, "tpu"


def _group_sizes(m, groups):
    """Ragged group sizes summing to ``m`` (fixed seed), some not tile multiples."""
    import numpy as np

    rng = np.random.default_rng(0)
    cuts = np.sort(rng.choice(np.arange(1, m), groups - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [m]])).astype(np.int32)


def tpu_gmm(shape, grad=False):
    """Megablox grouped matmul (``ops.gmm``, whose VJP is ``gmm`` and ``tgmm``)
    against per-group ``jnp.dot``."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas.ops.tpu.megablox import ops

    m, k, n, groups = shape
    k1, k2 = _keys(2)
    lhs, rhs = jax.random.normal(k1, (m, k)), jax.random.normal(k2, (groups, k, n))
    gs = jnp.asarray(_group_sizes(m, groups))
    starts = np.concatenate([[0], np.cumsum(np.asarray(gs))])
    tiling = (128, 128, 128)

    def f(lhs, rhs, interpret):
        return ops.gmm(lhs, rhs, gs, jnp.float32, tiling, None, None, False, interpret)

    def ref(lhs, rhs):
        gid = np.searchsorted(starts[1:], np.arange(m), side="right")
        return jnp.einsum("mk,mkn->mn", lhs, rhs[gid], precision="highest")

    if grad:
        loss = lambda g: lambda x, w: jnp.sum(g(x, w) ** 2)  # noqa: E731
        return (lambda x, w, interpret: jax.grad(
                    loss(lambda *a: f(*a, interpret)), argnums=(0, 1))(x, w),
                (lhs, rhs), jax.grad(loss(ref), argnums=(0, 1)), "tpu")
    return f, (lhs, rhs), ref, "tpu"


def _paged(batch, kv_heads, pages_total, page_size, pages_per_seq, d, lengths,
           bf16_values=False):
    """A paged KV cache (``[kv_heads, pages, page_size, d]``), random page tables and
    the dense ``[batch, seq, kv_heads, d]`` K/V they describe. ``bf16_values``: f32
    pages holding bfloat16-representable values (the TPU kernel computes on K/V cast
    to bfloat16)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    k1, k2 = _keys(2)
    kp = jax.random.normal(k1, (kv_heads, pages_total, page_size, d))
    vp = jax.random.normal(k2, (kv_heads, pages_total, page_size, d))
    if bf16_values:
        kp, vp = (p.astype(jnp.bfloat16).astype(jnp.float32) for p in (kp, vp))
    rng = np.random.default_rng(1)
    table = rng.permutation(pages_total)[: batch * pages_per_seq].reshape(
        batch, pages_per_seq).astype(np.int32)
    dense = lambda p: jnp.moveaxis(  # noqa: E731
        p[:, table].reshape(kv_heads, batch, pages_per_seq * page_size, d), 0, 2)
    return kp, vp, jnp.asarray(table), dense(kp), dense(vp), jnp.asarray(
        np.asarray(lengths, np.int32))


def tpu_paged_attention(shape, inline_seq_dim=True):
    """TPU paged attention (decode) against dense grouped-query attention over the
    pages each sequence's table names."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention, util

    batch, heads, kv_heads, page_size, pages_per_seq, d = shape
    seq = page_size * pages_per_seq
    lengths = [seq - 3 * i - 1 for i in range(batch)]
    kp, vp, table, k, v, lens = _paged(batch, kv_heads, 2 * batch * pages_per_seq,
                                       page_size, pages_per_seq, d, lengths, True)
    q = jax.random.normal(_keys(3)[2], (batch, heads, d))

    def f(q, kp, vp, interpret):
        del interpret  # forced by the worker
        return paged_attention(q, kp, vp, lens, table, pages_per_compute_block=2,
                               inline_seq_dim=inline_seq_dim)

    def ref(q, kp, vp):
        return util.grouped_query_attention_reference(
            q, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), lens)

    return f, (q, kp, vp), ref, "tpu"


def gpu_paged_attention(shape):
    """GPU (Triton-style) paged attention against its shipped reference."""
    import jax
    from jax.experimental.pallas.ops.gpu import paged_attention as pa

    batch, heads, kv_heads, page_size, pages_per_seq, d = shape
    seq = page_size * pages_per_seq
    lengths = [seq - 5 * i - 1 for i in range(batch)]
    kp, vp, table, k, v, lens = _paged(batch, kv_heads, 2 * batch * pages_per_seq,
                                       page_size, pages_per_seq, d, lengths)
    q = jax.random.normal(_keys(3)[2], (batch, heads, d))

    def f(q, kp, vp, interpret):
        return pa.paged_attention(q, kp, vp, table, lens, block_h=heads // kv_heads,
                                  pages_per_compute_block=2, k_splits=2,
                                  interpret=interpret)

    def ref(q, kp, vp):
        return pa.paged_attention_reference(q, k, v, lens)

    return f, (q, kp, vp), ref, "cuda"


def tpu_ragged_paged_attention(shape):
    """Ragged paged attention (mixed prefill and decode) against the shipped
    ``ref_ragged_paged_attention``."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa

    q_heads, kv_heads, d, page_size = shape
    q_lens, kv_lens = [5, 1, 17], [40, 33, 64]
    pages_per_seq, total_pages = 8, 32
    k1, k2 = _keys(2)
    tokens = sum(q_lens)
    q = jax.random.normal(k1, (tokens, q_heads, d))
    kv = jax.random.normal(k2, (total_pages, page_size, 2 * kv_heads, d))
    rng = np.random.default_rng(2)
    table = jnp.asarray(rng.permutation(total_pages)[: 3 * pages_per_seq].reshape(
        3, pages_per_seq).astype(np.int32))
    cu = jnp.asarray(np.cumsum([0, *q_lens]).astype(np.int32))
    kvl = jnp.asarray(np.asarray(kv_lens, np.int32))
    nseq = jnp.asarray([3], jnp.int32)

    def f(q, kv, interpret):
        del interpret  # forced by the worker
        return rpa.ragged_paged_attention(q, kv, kvl, table, cu, nseq,
                                          num_kv_pages_per_block=2,
                                          num_queries_per_block=8)

    def ref(q, kv):
        return rpa.ref_ragged_paged_attention(q, kv, kvl, table, cu, nseq)

    return f, (q, kv), ref, "tpu"


def tpu_all_gather(shape):
    """The TPU all-gather example (remote DMAs around a ring of devices, in
    ``shard_map``) on 4 simulated CPU devices, against the unsharded input."""
    import jax
    import numpy as np
    from jax.experimental.pallas.ops.tpu import all_gather

    mesh = jax.make_mesh((4,), ("x",))
    x = jax.random.normal(_keys(1)[0], shape)
    x = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))

    def f(x, interpret):
        del interpret  # forced by the worker
        return all_gather.all_gather(x, mesh=mesh, axis_name="x")

    return f, (x,), lambda x: np.asarray(x), "tpu"


# The Mosaic GPU kernels (``*_mgpu.py``): no ``interpret`` flag, and persistent grids
# sized by the GPU's SM count. Platform ``mgpu:<target>``: the worker compiles them for
# that compile-only device, and runs their numbers (ours only) in plgpu's interpret mode,
# forced, with a 4-SM grid (upstream has no way to run them on a CPU).


class _Device:
    """A stand-in device with ``n`` SMs (``core_count``), for the SM-count look-ups."""

    def __init__(self, n):
        self.core_count = n


class _JaxWithDevices(types.ModuleType):
    """``jax`` as one kernel module sees it, with ``jax.devices()`` a list of devices
    of ``n`` SMs (the module reads ``jax.devices()[0].core_count``)."""

    def __init__(self, jax, n):
        super().__init__("jax")
        self._jax, self._n = jax, n

    def devices(self, *a, **kw):
        return [_Device(self._n)]

    def local_devices(self, *a, **kw):
        return [_Device(self._n)]

    def __getattr__(self, name):
        return getattr(self._jax, name)


def _sms(n):
    """Patches the SM count the persistent kernels read (the harness's knob, not theirs):
    ``get_num_sms()``, ``backend.get_default_device().core_count`` and
    ``jax.devices()[0].core_count``/``jax.local_devices()[0].core_count`` (a CPU device
    has none)."""
    import jax
    from jax.experimental.pallas.ops.gpu import (
        blackwell_ragged_dot_mgpu,
        hopper_matmul_mgpu,
        hopper_mixed_type_matmul_mgpu,
        transposed_ragged_dot_mgpu,
    )

    hopper_matmul_mgpu.get_num_sms = lambda: n
    hopper_mixed_type_matmul_mgpu.backend = types.SimpleNamespace(
        get_default_device=lambda: _Device(n))
    transposed_ragged_dot_mgpu.jax = _JaxWithDevices(jax, n)
    blackwell_ragged_dot_mgpu.jax = _JaxWithDevices(jax, n)
    # The multi-device kernels, only where loaded (their rows import them).
    prefix = "jax.experimental.pallas.ops.gpu."
    for mod in ("all_gather_mgpu", "reduce_scatter_mgpu"):
        if prefix + mod in sys.modules:
            sys.modules[prefix + mod].backend = types.SimpleNamespace(
                get_default_device=lambda: _Device(n))
    if prefix + "collective_matmul_mgpu" in sys.modules:
        sys.modules[prefix + "collective_matmul_mgpu"].jax = _JaxWithDevices(jax, n)


def mgpu_hopper_matmul(shape):
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

    m, k, n = shape
    a = jax.random.uniform(_keys(2)[0], (m, k), jnp.float16)
    b = jax.random.uniform(_keys(2)[1], (k, n), jnp.float16)
    cfg = hm.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)

    def f(a, b, interpret):
        del interpret  # forced by the worker
        return hm.matmul(a, b, None, cfg)

    return f, (a, b), lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32), \
        "mgpu:sm_90a"


def mgpu_hopper_mixed_matmul(shape):
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as hm

    m, k, n = shape
    a = jax.random.randint(_keys(2)[0], (m, k), -8, 8, jnp.int8)
    b = jax.random.uniform(_keys(2)[1], (k, n), jnp.float16, -1, 1)
    cfg = hm.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2)

    def f(a, b, interpret):
        del interpret  # forced by the worker
        return hm.mixed_matmul_kernel(a, b, out_dtype=jnp.float16, config=cfg)

    return f, (a, b), lambda a, b: hm.reference(a, b, out_dtype=jnp.float16), "mgpu:sm_90a"


def mgpu_attention(shape):
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import attention_mgpu as am

    q, k, v = (jax.random.normal(key, shape, jnp.float16) for key in _keys(3))
    cfg = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2)

    def f(q, k, v, interpret):
        del interpret  # forced by the worker
        return am.attention(q, k, v, cfg)

    return f, (q, k, v), am.attention_reference, "mgpu:sm_90a"


def mgpu_blackwell_matmul(shape, collective=False):
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import blackwell_matmul_mgpu as bm

    m, k, n = shape
    a = jax.random.uniform(_keys(2)[0], (m, k), jnp.float16, -1, 1)
    b = jax.random.uniform(_keys(2)[1], (k, n), jnp.float16, -1, 1)
    # collective=True: CTA pairs (a cluster of 2 blocks sharing 2-CTA tcgen05 MMAs).
    cfg = bm.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2,
                          collective=collective)

    def f(a, b, interpret):
        del interpret  # forced by the worker
        return bm.matmul_kernel(a, b, cfg)

    return f, (a, b), lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32), \
        "mgpu:sm_100a"


def mgpu_ragged_dot(shape):
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu as rd

    m, k, n, groups = shape
    lhs = jax.random.normal(_keys(2)[0], (m, k), jnp.float16)
    rhs = jax.random.normal(_keys(2)[1], (groups, k, n), jnp.float16)
    sizes = jnp.asarray([m // groups + (m % groups if i == 0 else 0) for i in range(groups)],
                        jnp.int32)

    def f(lhs, rhs, interpret):
        del interpret  # forced by the worker
        return rd.ragged_dot(lhs, rhs, group_sizes=sizes, block_m=64, block_n=64, block_k=64,
                             max_concurrent_steps=2, grid_block_n=1)

    def ref(lhs, rhs):
        return jax.lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=jnp.float32)

    return f, (lhs, rhs), ref, "mgpu:sm_90a"


def mgpu_transposed_ragged_dot(shape):
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import transposed_ragged_dot_mgpu as td

    k, m, n, groups = shape
    lhs = jax.random.normal(_keys(2)[0], (k, m), jnp.float16)
    rhs = jax.random.normal(_keys(2)[1], (k, n), jnp.float16)
    sizes = jnp.asarray([k // groups + (k % groups if i == 0 else 0) for i in range(groups)],
                        jnp.int32)

    def f(lhs, rhs, interpret):
        del interpret  # forced by the worker
        return td.transposed_ragged_dot(lhs, rhs, group_sizes=sizes, block_m=64, block_n=64,
                                        block_k=64, max_concurrent_steps=2, grid_block_n=1)

    return f, (lhs, rhs), lambda lhs, rhs: td.ref_transposed_ragged_dot(lhs, rhs, sizes), \
        "mgpu:sm_90a"


def mgpu_blackwell_ragged_dot(shape):
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import blackwell_matmul_mgpu as bm
    from jax.experimental.pallas.ops.gpu import blackwell_ragged_dot_mgpu as brd

    m, k, n, groups = shape
    lhs = jax.random.normal(_keys(2)[0], (m, k), jnp.float16)
    rhs = jax.random.normal(_keys(2)[1], (groups, k, n), jnp.float16)
    sizes = jnp.asarray(_group_sizes(m, groups), jnp.int32)
    # collective=True (CTA pairs), as the kernel's own benchmark: without it the kernel
    # reads the cluster axis "x" that its mesh does not have (upstream fails the same).
    cfg = brd.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2,
                           collective=True, grid_tile_width=1,
                           grid_minor_dim=bm.MatmulDimension.N)

    def f(lhs, rhs, interpret):
        del interpret  # forced by the worker
        return brd.ragged_dot_kernel(lhs, rhs, sizes, cfg)

    def ref(lhs, rhs):
        return jax.lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=jnp.float32)

    return f, (lhs, rhs), ref, "mgpu:sm_100a"


# Upstream's multi-device Mosaic GPU kernels (multimem stores/reductions, remote
# semaphores), in ``shard_map`` over a mesh of 2 devices as upstream's tests run them:
# the CPU devices for numbers and lowering, compile-only H100s for compiling.


def _mgpu_sharded(shape, spec, dtype, seed=0):
    """A global input sharded over the CPU mesh ``("x",)`` of every device."""
    import jax

    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    x = jax.random.normal(_keys(seed + 1)[seed], shape, dtype)
    return jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))


def mgpu_all_gather(shape):
    """``all_gather_mgpu.all_gather`` (multimem stores) along rows, against the input."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas.ops.gpu import all_gather_mgpu as ag

    P = jax.sharding.PartitionSpec
    x = _mgpu_sharded(shape, P("x", None), jnp.float32)
    n = jax.device_count()

    def f(x, interpret):
        del interpret  # forced by the worker
        body = lambda x: ag.all_gather(x, axis_name="x", tile_size=1024)  # noqa: E731
        return jax.shard_map(body, in_specs=P("x", None), out_specs=P("x", None),
                             check_vma=False)(x)

    return f, (x,), lambda x: np.tile(np.asarray(x), (n, 1)), "mgpu:sm_90a"


def mgpu_reduce_scatter(shape):
    """``reduce_scatter_mgpu.reduce_scatter`` (multimem add-reductions) along rows:
    each device's shard is summed over devices, then scattered."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas.ops.gpu import reduce_scatter_mgpu as rs

    P = jax.sharding.PartitionSpec
    x = _mgpu_sharded(shape, P("x", None), jnp.float32)
    n = jax.device_count()

    def f(x, interpret):
        del interpret  # forced by the worker
        body = lambda x: rs.reduce_scatter(x, axis_name="x", tile_size=1024)  # noqa: E731
        return jax.shard_map(body, in_specs=P("x", None), out_specs=P("x", None),
                             check_vma=False)(x)

    def ref(x):
        return np.asarray(x).reshape(n, -1, x.shape[1]).sum(0)

    return f, (x,), ref, "mgpu:sm_90a"


def mgpu_collective_matmul(shape):
    """``collective_matmul_mgpu.all_gather_lhs_matmul``: LHS rows all-gathered while
    multiplying by the local RHS columns, against ``lhs @ rhs``."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas.ops.gpu import collective_matmul_mgpu as cm

    m_shard, n_shard, k = shape
    n = jax.device_count()
    P = jax.sharding.PartitionSpec
    lhs = _mgpu_sharded((n * m_shard, k), P("x", None), jnp.bfloat16, 0)
    rhs = _mgpu_sharded((k, n * n_shard), P(None, "x"), jnp.bfloat16, 1)
    config = cm.TuningConfig(tile_m=64, tile_n=64, tile_k=64, max_concurrent_steps=2,
                             grid_minor_dim=cm.MatmulDimension.N, grid_tile_width=1,
                             wg_dimension=cm.MatmulDimension.N)

    def f(lhs, rhs, interpret):
        del interpret  # forced by the worker
        body = lambda a, b: cm.all_gather_lhs_matmul(  # noqa: E731
            a, b, "x", config=config, dtype=jnp.bfloat16)
        return jax.shard_map(body, in_specs=(P("x", None), P(None, "x")),
                             out_specs=P(None, "x"), check_vma=False)(lhs, rhs)

    def ref(lhs, rhs):
        return np.asarray(lhs, np.float32) @ np.asarray(rhs, np.float32)

    return f, (lhs, rhs), ref, "mgpu:sm_90a"


KERNELS = {
    "gpu/softmax": (gpu_softmax, [(64, 256), (100, 300)]),
    "gpu/layer_norm": (gpu_norm, [(4, 16, 256), (3, 10, 300)]),
    "gpu/layer_norm grad": (lambda s: gpu_norm(s, grad=True), [(4, 16, 256)]),
    "gpu/rms_norm": (lambda s: gpu_norm(s, "rms_norm"), [(4, 16, 256), (3, 10, 300)]),
    "gpu/rms_norm grad": (lambda s: gpu_norm(s, "rms_norm", grad=True), [(4, 16, 256)]),
    "gpu/attention": (gpu_attention, [(1, 128, 2, 64), (1, 192, 2, 64)]),
    "gpu/attention grad": (lambda s: gpu_attention(s, grad=True), [(1, 128, 2, 64)]),
    "gpu/decode_attention mqa": (gpu_decode_attention, [(2, 4, 1, 256, 64)]),
    "gpu/decode_attention gqa": (lambda s: gpu_decode_attention(s, "gqa"),
                                 [(2, 8, 2, 256, 64)]),
    "tpu/flash_attention": (tpu_flash_attention, [(1, 2, 256, 128), (2, 1, 384, 128)]),
    "tpu/flash_attention grad": (lambda s: tpu_flash_attention(s, grad=True),
                                 [(1, 2, 256, 128)]),
    "tpu/matmul": (tpu_matmul, [(256, 256, 256), (384, 256, 128)]),
    "tpu/splash_attention": (tpu_splash_attention, [(2, 256, 128), (1, 384, 128)]),
    "tpu/splash_attention local": (lambda s: tpu_splash_attention(s, mask="local"),
                                   [(2, 256, 128)]),
    "tpu/splash_attention grad": (lambda s: tpu_splash_attention(s, grad=True),
                                  [(2, 256, 128)]),
    "tpu/megablox gmm": (tpu_gmm, [(512, 128, 256, 4), (384, 256, 128, 3)]),
    "tpu/megablox gmm grad": (lambda s: tpu_gmm(s, grad=True), [(384, 256, 128, 3)]),
    "tpu/paged_attention": (tpu_paged_attention, [(2, 8, 2, 16, 8, 128),
                                                  (3, 4, 1, 16, 6, 128)]),
    "tpu/paged_attention seq-grid": (lambda s: tpu_paged_attention(s, False),
                                     [(2, 8, 2, 16, 8, 128)]),
    "tpu/ragged_paged_attention": (tpu_ragged_paged_attention, [(8, 2, 128, 16)]),
    "tpu/all_gather": (tpu_all_gather, [(32, 128)]),
    "gpu/paged_attention": (gpu_paged_attention, [(2, 32, 2, 16, 8, 64),
                                                  (3, 16, 1, 16, 4, 64)]),
    "gpu/hopper_matmul_mgpu": (mgpu_hopper_matmul, [(256, 256, 256), (384, 128, 256)]),
    "gpu/attention_mgpu": (mgpu_attention, [(1, 128, 2, 64)]),
    "gpu/blackwell_matmul_mgpu": (mgpu_blackwell_matmul, [(256, 256, 256)]),
    "gpu/blackwell_matmul_mgpu collective": (
        lambda s: mgpu_blackwell_matmul(s, collective=True), [(512, 256, 512)]),
    "gpu/ragged_dot_mgpu": (mgpu_ragged_dot, [(256, 128, 128, 2), (200, 128, 128, 3)]),
    "gpu/hopper_mixed_type_matmul_mgpu": (mgpu_hopper_mixed_matmul, [(256, 256, 256),
                                                                    (384, 128, 256)]),
    "gpu/transposed_ragged_dot_mgpu": (mgpu_transposed_ragged_dot, [(256, 128, 128, 2),
                                                                    (320, 128, 64, 3)]),
    "gpu/blackwell_ragged_dot_mgpu": (mgpu_blackwell_ragged_dot, [(512, 128, 256, 3)]),
    "gpu/all_gather_mgpu": (mgpu_all_gather, [(2048, 64)]),
    "gpu/reduce_scatter_mgpu": (mgpu_reduce_scatter, [(2048, 64)]),
    "gpu/collective_matmul_mgpu": (mgpu_collective_matmul, [(128, 128, 256)]),
}

# Kernels run over a mesh of several (simulated CPU) devices: name fragment -> count.
DEVICE_COUNTS = {"tpu/all_gather": 4, "all_gather_mgpu": 2, "reduce_scatter_mgpu": 2,
                 "collective_matmul_mgpu": 2}


# ------------------------------------------------------------------------------------
# One worker: one implementation, one kernel, one shape.


def _first_line(e: BaseException) -> str:
    """The error's first line; for an error raised in a host callback (whose message
    starts with the callback's traceback), the line naming the callback's own error."""
    lines = str(e).strip().splitlines() or [""]
    line = lines[0]
    if "Traceback (most recent call last)" in line:
        body = lines[1:lines.index("At:")] if "At:" in lines else lines[1:]
        inner = [ln for ln in body if ln and not ln[0].isspace()
                 and not ln.startswith(("Traceback", "The above exception", "During "))]
        if inner:
            line = f"{line.split('Traceback')[0].strip()} {inner[-1]}"
    return f"{type(e).__name__}: {line[:150]}"


TARGETS = os.path.join(ROOT, "..", "shared", "reference", "gpu-targets")
TARGET_FILES = {"sm_90a": "h100_sxm.txtpb", "sm_100a": "b200.txtpb"}


def _spec(a):
    """The ``PartitionSpec`` an input is sharded with (replicated if not sharded)."""
    import jax

    sharding = getattr(a, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
        return sharding.spec
    return jax.sharding.PartitionSpec()


def _mesh_size(args) -> int:
    """How many devices the inputs are sharded over (1 if none is)."""
    import jax

    sizes = [a.sharding.mesh.size for a in args
             if isinstance(getattr(a, "sharding", None), jax.sharding.NamedSharding)]
    return max(sizes, default=1)


def _input_mesh(args):
    """``jax.set_mesh`` of the inputs' mesh (``shard_map`` without ``mesh=`` reads it)."""
    import jax

    for a in args:
        if isinstance(getattr(a, "sharding", None), jax.sharding.NamedSharding):
            return jax.set_mesh(a.sharding.mesh)
    return _nullcontext()


def _compile_only(fn, args, target: str) -> str:
    """Compiles ``fn`` for a compile-only CUDA device of ``target`` (XLA's whole GPU
    pipeline: Mosaic GPU's passes or Triton, PTX, ptxas), as both sides would on a GPU."""
    import jax
    import numpy as np
    from jax.experimental import topologies

    with open(os.path.join(TARGETS, TARGET_FILES[target])) as f:
        config = f.read()
    n = _mesh_size(args)
    devs = topologies.get_topology_desc(platform="cuda", target_config=config,
                                        topology=f"1x1x{n}").devices
    mesh = jax.sharding.Mesh(np.array(devs), ("x",))
    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=jax.sharding.NamedSharding(
        mesh, _spec(a))) for a in args]
    with jax.set_mesh(mesh):
        jax.jit(lambda *a: fn(*a, interpret=False)).trace(*abstract).lower().compile()
    return "ok"


def worker(impl: str, name: str, shape: tuple) -> dict:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    if impl == "ours":
        import importlib.util

        spec = importlib.util.spec_from_file_location("upstream_shim", SHIM)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    import jax
    import numpy as np

    build, _ = KERNELS[name]
    out = {"numbers": None, "ms": None, "lower": None, "compile": None}
    try:
        fn, args, ref, platform = build(shape)
    except Exception as e:  # noqa: BLE001 - reported in the table
        return {level: _first_line(e) for level in ("numbers", "lower", "compile")} | {
            "ms": None}
    target = platform.partition(":")[2] or "sm_90a"
    platform = platform.partition(":")[0]
    forced = None
    if platform == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        forced = pltpu.force_tpu_interpret_mode
    elif platform == "mgpu":
        if impl == "ours":
            from jax.experimental.pallas import mosaic_gpu as plgpu

            from pallas import plugins

            _sms(4)
            forced = lambda: plugins.forced_interpret_mode(plgpu.InterpretParams())  # noqa: E731
        else:  # upstream has no interpret switch for these kernels: they run as written
            _sms(4)
    try:
        run = jax.jit(lambda *a: fn(*a, interpret=True))
        ctx = forced() if forced else _nullcontext()
        with ctx, _input_mesh(args):
            got = jax.block_until_ready(run(*args))
            times = []
            for _ in range(3):
                t = time.perf_counter()
                jax.block_until_ready(run(*args))
                times.append(time.perf_counter() - t)
        want = ref(*args)
        ok = all(np.allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                             rtol=2e-2, atol=2e-2)
                 for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
        out["numbers"] = "ok" if ok else "FAIL"
        out["ms"] = statistics.median(times) * 1e3
    except Exception as e:  # noqa: BLE001
        out["numbers"] = _first_line(e)
    if platform == "mgpu":
        # The persistent grid is as wide as the device's SMs (132 on H100, 148 on B200).
        _sms(132 if target == "sm_90a" else 148)
    try:
        # Sharded inputs keep their sharding (a kernel in ``shard_map`` checks it).
        abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
                    if isinstance(getattr(a, "sharding", None), jax.sharding.NamedSharding)
                    else jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
        with _input_mesh(args):
            low = jax.jit(lambda *a: fn(*a, interpret=False)).trace(*abstract).lower(
                lowering_platforms=("tpu" if platform == "tpu" else "cuda",))
        text = low.as_text()
        want_call = "tpu_custom_call" if platform == "tpu" else "custom_call"
        out["lower"] = "ok" if want_call in text else "no kernel in the lowered module"
    except Exception as e:  # noqa: BLE001
        out["lower"] = _first_line(e)
    if platform in ("cuda", "mgpu"):
        try:
            out["compile"] = _compile_only(fn, args, target)
        except Exception as e:  # noqa: BLE001
            out["compile"] = _first_line(e)
    return out


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _spawn(impl: str, name: str, shape: tuple) -> dict:
    cmd = [sys.executable, __file__, "--worker", impl, "--kernel", name,
           "--shape", json.dumps(shape)]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    count = next((n for frag, n in DEVICE_COUNTS.items() if frag in name), None)
    if count:  # a mesh of simulated CPU devices
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                            f" --xla_force_host_platform_device_count={count}").strip()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    err = (proc.stderr.strip().splitlines() or ["no output"])[-1][:150]
    return {"numbers": f"crashed: {err}", "ms": None, "lower": f"crashed: {err}",
            "compile": f"crashed: {err}"}


def _cell(v) -> str:
    return "-" if v is None else str(v).replace("|", "\\|")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", dest="keyword", help="only kernels whose name contains this")
    ap.add_argument("--worker", choices=["ours", "upstream"], help=argparse.SUPPRESS)
    ap.add_argument("--kernel", help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.kernel, tuple(json.loads(args.shape)))))
        return 0
    print("| kernel | shape | numbers (ours) | numbers (upstream) | ms ours | ms upstream | "
          "lower (ours) | lower (upstream) | compile (ours) | compile (upstream) |")
    print("|---|---|---|---|---:|---:|---|---|---|---|")
    all_ok = True
    for name, (_, shapes) in KERNELS.items():
        if args.keyword and args.keyword not in name:
            continue
        for shape in shapes:
            o, u = _spawn("ours", name, shape), _spawn("upstream", name, shape)
            ms = lambda r: "-" if r["ms"] is None else f"{r['ms']:.1f}"  # noqa: E731
            print(f"| {name} | {tuple(shape)} | {_cell(o['numbers'])} | "
                  f"{_cell(u['numbers'])} | {ms(o)} | {ms(u)} | {_cell(o['lower'])} | "
                  f"{_cell(u['lower'])} | {_cell(o.get('compile'))} | "
                  f"{_cell(u.get('compile'))} |", flush=True)
            for level in ("numbers", "lower", "compile"):
                if u.get(level) == "ok" and o.get(level) != "ok":
                    all_ok = False
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
