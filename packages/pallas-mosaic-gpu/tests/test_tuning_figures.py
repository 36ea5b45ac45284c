"""pallas.tuning without a GPU: Mosaic GPU's compile level gives the static model its
figures (registers, shared memory from ptxas), and a config over the shared-memory budget
is pruned with the backend's own error."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
from pallas import tuning
from pallas_mosaic_gpu import compiler


def _exp_minus(x, y, *, rows):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = jnp.exp(x_ref[...]) - y_ref[...]

    spec = pl.BlockSpec((rows, 128), lambda i: (i, 0))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(x.shape[0] // rows,), in_specs=[spec, spec],
                          out_specs=spec, backend="mosaic_gpu")(x, y)


def test_the_model_ranks_mosaic_gpu_configs_from_ptxas_figures(tmp_path, monkeypatch):
    pytest.importorskip("jax_plugins.xla_cuda13", reason="needs jax-cuda13-plugin")
    try:
        compiler.find_toolchain()
    except compiler.ToolchainMissingError as e:
        pytest.skip(str(e))
    monkeypatch.setenv(tuning.ENV_CACHE, str(tmp_path / "t.sqlite3"))
    f = tuning.autotune([{"rows": 8}, {"rows": 32}, {"rows": 512}])(_exp_minus)
    s = jax.ShapeDtypeStruct((512, 128), jnp.float32)
    report = tuning.tune(f, s, s, platform="cuda", kind="sm_90a")
    assert report.method == "model" and "without that device" in report.why_model
    small, mid, big = report.results
    # 3 blocks of 512x128 f32, double-buffered: over the 227 KiB a block may have.
    assert big.status == "pruned" and "SmemExceededError" in big.reason
    for r in (small, mid):
        (kernel,) = r.figures
        assert 0 < kernel["compiled"]["registers"] <= 255
        assert kernel["compiled"]["smem_bytes"] >= 3 * r.config["rows"] * 128 * 4
        assert "ex2" in kernel["compiled"]["instruction_mix"]
    chosen = min((small, mid), key=lambda r: (r.estimate, r.index))
    assert chosen.status == "chosen" and report.chosen == chosen.config
    assert report.key.backend.startswith("mosaic_gpu ") and report.key.device == "cuda:sm_90a"
