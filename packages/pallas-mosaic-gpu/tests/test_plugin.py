"""The plugin: discovered through its entry point, selected by its CompilerParams."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
import pallas.plugins
import pallas_mosaic_gpu as plgpu


def test_plugin_is_discovered_through_its_entry_point():
    b = pallas.plugins.get_backend("mosaic_gpu")
    assert b.name == "mosaic_gpu" and b.package == "pallas-mosaic-gpu"
    assert b.version == plgpu.__version__
    assert b.platforms == ("cuda",)
    assert b.compiler_params_type is plgpu.CompilerParams
    assert "mosaic_gpu" in [x.name for x in pallas.plugins.list_backends()]


def test_claims_only_what_the_conformance_run_passes():
    caps = pallas.plugins.get_backend("mosaic_gpu").capabilities
    assert {"elementwise", "scratch"} <= caps
    # Not lowered yet: claiming them would report passes that did not happen.
    assert {"aliasing", "export"} <= caps
    assert not caps & {"carry_across_blocks",
                       "scalar_prefetch", "atomics", "semaphores"}


def test_compiler_params_select_the_backend():
    params = plgpu.CompilerParams(dimension_semantics=["parallel", "sequential"],
                                  max_concurrent_steps=2)
    assert params.BACKEND == "mosaic_gpu" and isinstance(params, pl.CompilerParams)
    assert params.dimension_semantics == ("parallel", "sequential")
    assert params.reduction_scratch_bytes == 2048
    assert params.profile_trace_scope is plgpu.TraceScope.WARPGROUP
    assert params.lowering_semantics is plgpu.LoweringSemantics.Lane
    assert params.replace(approx_math=True).approx_math
    hash(params)
    assert pallas.plugins.select_backend("cuda", compiler_params=params).name == "mosaic_gpu"


def test_compiler_params_reject_bad_values():
    with pytest.raises(ValueError, match="dimension_semantics.*'arbitrary'"):
        plgpu.CompilerParams(dimension_semantics=("arbitrary",))
    with pytest.raises(ValueError, match="profile_space and profile_dir"):
        plgpu.CompilerParams(profile_space=16)
    with pytest.raises(ValueError, match="max_concurrent_steps"):
        plgpu.CompilerParams(max_concurrent_steps=0)
    with pytest.raises(TypeError):
        plgpu.CompilerParams(True)  # keyword-only, as upstream


def test_lowering_for_cuda_emits_the_mosaic_gpu_custom_call():
    pytest.importorskip("jax_plugins.xla_cuda13", reason="needs jax-cuda13-plugin")

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    f = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                       compiler_params=plgpu.CompilerParams())
    x = jnp.zeros((8, 128), jnp.float32)
    text = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert "custom_call @mosaic_gpu_v2" in text


def test_a_dynamic_grid_is_refused_naming_the_backend_as_upstream():
    """Mosaic GPU has no dynamic grid bounds (upstream's neither): a clear trace-time
    error, never a wrong launch grid."""
    def f(n, x):
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        return pl.pallas_call(lambda x_ref, o_ref: o_ref.__setitem__(..., x_ref[...]),
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(n,),
                              in_specs=[spec], out_specs=spec,
                              compiler_params=plgpu.CompilerParams())(x)

    with pytest.raises(NotImplementedError, match=r"dynamic grid bounds not supported in "
                                                  r"the Mosaic GPU backend"):
        jax.jit(f).trace(jnp.int32(2), jnp.zeros((16, 128), jnp.float32))
    assert "dynamic_grid" not in pallas.plugins.get_backend("mosaic_gpu").capabilities


def test_targeting_scopes_the_compile_target(monkeypatch):
    from pallas_mosaic_gpu._src.lowering.kernel import target_of

    monkeypatch.delenv("PALLAS_MOSAIC_GPU_TARGET", raising=False)
    b = pallas.plugins.get_backend("mosaic_gpu")
    with b.targeting("cuda", "sm_100a"):
        assert target_of(None) == "sm_100a"
    assert target_of(None) is None
    with b.targeting("cuda"):
        assert target_of(None) is None
    with pytest.raises(ValueError, match="sm_90a, sm_100a; got target 'sm_80'"):
        with b.targeting("cuda", "sm_80"):
            pass
    with pytest.raises(ValueError, match="not for 'rocm'"):
        with b.targeting("rocm"):
            pass
