"""``pallas_tpu.compile``: kernels compiled by libtpu, the real TPU compiler, for a
deviceless chip; figures read from what it produced; rejections and aborts reported."""

from __future__ import annotations

import os
import textwrap

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
import pallas_tpu as pltpu
from pallas_tpu import compiler

pytestmark = pytest.mark.skipif(not compiler.libtpu_available(),
                                reason="libtpu is not installed (pallas-tpu[compile])")


def _double(x):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    spec = pl.BlockSpec((128, 128), lambda i: (i, 0))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(x.shape[0] // 128,), in_specs=[spec], out_specs=spec,
                          backend="mosaic_tpu", name="double")(x)


def test_a_kernel_compiles_with_figures_from_the_compiler():
    (k,) = pltpu.compile(_double, jax.ShapeDtypeStruct((256, 128), jnp.float32), chip="v6e")
    assert k.name == "double" and k.chip == k.target == "v6e"
    # One 64 KiB f32 block per operand, double-buffered by the pipeline.
    assert k.vmem_bytes == 2 * 2 * 128 * 128 * 4
    mix = k.op_mix()
    # 16 (8, 128) vregs loaded, multiplied and stored; no MXU, no DMA in the kernel body.
    assert (mix["vector_load"], mix["vector_store"], mix["mxu"], mix["dma"]) == (16, 16, 0, 0)
    assert k.llo_ops()["vmul.f32"] == 16
    assert "tpu.load" in k.mosaic and "llo.vector_store" in k.llo
    assert k.stages[0] == "original" and k.stages[-1] == "post-finalize-llo"


def test_the_chip_comes_from_compiler_params_then_the_environment(monkeypatch):
    def f(x):
        def kernel(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1

        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              grid=(1,), in_specs=[spec], out_specs=spec,
                              compiler_params=pltpu.CompilerParams(chip="v4"))(x)

    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    assert [k.chip for k in pltpu.compile(f, x)] == ["v4"]
    monkeypatch.setenv(compiler.ENV_CHIP, "v5p")
    assert [k.chip for k in pltpu.compile(_double, jax.ShapeDtypeStruct((128, 128),
                                                                       jnp.float32))] == ["v5p"]
    with pytest.raises(ValueError, match="chip='v9'.*valid: v4, v5e, v5p, v6e, 7x"):
        pltpu.compile(_double, x, chip="v9")


def test_a_rejection_names_the_kernel_the_chip_and_the_compilers_message():
    def f(x):  # a 20 MB scratch buffer, over v5e's 16 MiB scoped VMEM
        def kernel(x_ref, o_ref, big):
            @pl.when(pl.program_id(0) == 0)
            def _():
                big[...] = jnp.zeros_like(big)

            big[pl.program_id(0), 0:8, 0:128] += x_ref[...]
            o_ref[...] = big[0, 0:8, 0:128] + 1

        # A 3-D buffer whose last dim is not a multiple of 128: its VMEM bytes are not
        # predicted at trace time (test_vmem.py), so libtpu itself rejects it.
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              grid=(2,), in_specs=[spec], out_specs=spec,
                              scratch_shapes=[pltpu.VMEM((5, 1000, 1000), jnp.float32)],
                              name="big", backend="mosaic_tpu")(x)

    with pytest.raises(compiler.TpuCompileError) as info:
        pltpu.compile(f, jax.ShapeDtypeStruct((16, 128), jnp.float32), chip="v5e")
    e = info.value
    assert (e.kernel, e.chip) == ("big", "v5e")
    assert "RESOURCE_EXHAUSTED" in e.message and "scoped vmem limit" in e.message
    assert str(e).startswith("the TPU compiler (libtpu) rejects kernel 'big' for chip v5e: ")


def test_a_compiler_abort_is_reported_and_the_next_compile_works():
    from pallas_tpu._src.compiler import client

    with pytest.raises(client.WorkerCrashed, match=r"SIGABRT.*Check failed: abort_for_test"):
        client.compile_in_child({"abort_for_test": True, "topology": "v5e:2x2"})
    (k,) = pltpu.compile(_double, jax.ShapeDtypeStruct((128, 128), jnp.float32))
    assert k.vmem_bytes > 0


def test_the_backend_compile_hook_names_the_missing_extra(monkeypatch):
    from pallas_tpu._src.compiler import kernel

    monkeypatch.setattr(kernel, "libtpu_available", lambda: False)
    # A LevelUnreachableError: the conformance suite reports the level skipped.
    with pytest.raises(compiler.LibtpuMissingError, match=r"pallas-tpu\[compile\]"):
        pltpu.compile(_double, jax.ShapeDtypeStruct((128, 128), jnp.float32))


def test_mosaics_rejection_of_narrow_scalar_arithmetic_is_a_mosaic_error():
    """SMEM may hold int8/int16 scalars (Mosaic loads and stores them); adding them is
    Mosaic's "only i32" rejection, caught as ``pltpu.errors.MosaicError`` (upstream's
    ``error_handling.MosaicError``)."""
    def f(x, add):
        def kernel(x_ref, o_ref):
            o_ref[0] = x_ref[0] + x_ref[1] if add else x_ref[1]

        smem = pl.BlockSpec(memory_space=pltpu.SMEM)
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), x.dtype),
                              in_specs=[smem], out_specs=smem, name="narrow",
                              backend="mosaic_tpu")(x)

    x = jax.ShapeDtypeStruct((2,), jnp.int8)
    (k,) = pltpu.compile(lambda x: f(x, add=False), x, chip="v5e")
    assert k.name == "narrow"
    with pytest.raises(pltpu.errors.MosaicError,
                       match=r"Not implemented: Only i32 arith\.addi is supported"):
        pltpu.compile(lambda x: f(x, add=True), x, chip="v5e")


def test_an_exported_kernel_compiles_with_the_same_figures():
    """``compiler.compile_exported`` compiles any ``jax.export`` artifact for ``tpu``
    holding one Mosaic kernel (whichever lowering made it): the figures are those of
    ``pallas_tpu.compile`` for the same kernel."""
    x = jax.ShapeDtypeStruct((256, 128), jnp.float32)
    exported = jax.export.export(jax.jit(_double), platforms=["tpu"])(x)
    k = compiler.compile_exported(exported, chip="v6e", name="double")
    (want,) = pltpu.compile(_double, x, chip="v6e")
    assert (k.name, k.chip, k.vmem_bytes) == ("double", "v6e", want.vmem_bytes)
    assert k.op_mix() == want.op_mix() and k.op_mix()["vector_store"] == 16
    assert compiler.compile_exported(exported.serialize(), chip="v6e").vmem_bytes == (
        want.vmem_bytes)


def test_an_exported_artifact_without_one_tpu_kernel_is_refused():
    x = jax.ShapeDtypeStruct((256, 128), jnp.float32)
    plain = jax.export.export(jax.jit(lambda x: x * 2), platforms=["tpu"])(x)
    with pytest.raises(ValueError, match="holds 0 Mosaic kernels.*one kernel per artifact"):
        compiler.compile_exported(plain, chip="v5e")
    two = jax.export.export(jax.jit(lambda x: _double(_double(x))), platforms=["tpu"])(x)
    with pytest.raises(ValueError, match="holds 2 Mosaic kernels"):
        compiler.compile_exported(two, chip="v5e")
    on_cpu = jax.export.export(jax.jit(lambda x: x * 2), platforms=["cpu"])(x)
    with pytest.raises(ValueError, match=r"exported for \('cpu',\), not for 'tpu'"):
        compiler.compile_exported(on_cpu, chip="v5e")


_RING = textwrap.dedent('''
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    import pallas as pl
    import pallas_tpu as pltpu
    from pallas_tpu import compiler

    def kernel(x_ref, o_ref, send, recv):
        right = jax.lax.rem(jax.lax.axis_index("x") + 1, 4)
        copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=(right,),
                                            device_id_type=pl.DeviceIdType.MESH)
        copy.start()
        copy.wait()

    def permute(x):
        return pl.pallas_call(
            kernel, jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
            backend="mosaic_tpu", name="ring")(x)

    mesh = jax.make_mesh((4,), ("x",))
    f = jax.jit(jax.shard_map(permute, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))
    x = jax.ShapeDtypeStruct((32, 128), jnp.float32, sharding=NamedSharding(mesh, P("x")))
    k = compiler.compile_exported(jax.export.export(f, platforms=["tpu"])(x), chip="v6e",
                                  name="ring")
    print("ok", k.name, k.chip, k.op_mix()["dma"])
''')


def test_an_exported_shard_map_kernel_compiles_on_as_many_devices():
    """A kernel with remote DMAs and ``lax.axis_index`` lowers only under ``shard_map``:
    its artifact (4 devices) is compiled on 4 devices of the chip's topology. In a child
    process, which can have 4 CPU devices to export the program with."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _RING], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ok, name, chip, dmas = proc.stdout.split()[-4:]
    # The copy's start and its wait are DMA ops of the kernel itself.
    assert (ok, name, chip) == ("ok", "ring", "v6e") and int(dmas) >= 2
