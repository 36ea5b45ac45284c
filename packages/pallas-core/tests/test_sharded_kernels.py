"""Sharding-agnostic kernels: ``pallas_call`` under ``jax.jit`` with sharded operands
splits its grid over the devices (no ``shard_map``), from a rule derived from the grid,
the BlockSpecs and the dimension semantics; what cannot be split is gathered with a
warning.

The rule is checked here; the partitioned calls run on 8 CPU devices in a subprocess
(fixtures/sharded_kernels.py: ``--xla_force_host_platform_device_count`` must be set
before JAX starts), numbers on the interpreter and every installed backend's lowering.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import pallas as pl
from pallas._src.sharding_rule import derive_rule
from pallas.plugins import pallas_call_p

SDS = jax.ShapeDtypeStruct
FIXTURE = Path(__file__).parent / "fixtures" / "sharded_kernels.py"


def _rule(f, *args):
    eqn = next(e for e in jax.make_jaxpr(f)(*args).eqns if e.primitive is pallas_call_p)
    p = eqn.params
    return derive_rule(p["grid_mapping"], p["jaxpr"], p["compiler_params"])


def _matmul(x, y, **kw):
    def kernel(x_ref, y_ref, o_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += x_ref[...] @ y_ref[...]

    return pl.pallas_call(
        kernel, SDS((x.shape[0], y.shape[1]), jnp.float32), grid=(4, 4, 2),
        in_specs=[pl.BlockSpec((8, 8), lambda i, j, k: (i, k)),
                  pl.BlockSpec((8, 8), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((8, 8), lambda i, j, k: (i, j)), interpret=True, **kw)(x, y)


def test_matmul_splits_rows_and_columns_but_not_the_reduction():
    rule = _rule(_matmul, SDS((32, 16), jnp.float32), SDS((16, 32), jnp.float32))
    assert rule.splittable == {0, 1}
    assert rule.dims == ((0, None), (None, 1), (0, 1))
    assert "revisited" in rule.axis_reasons[2]
    assert "grid axis 2 cannot be split" in rule.dim_reasons[0][1]
    assert rule.reads_index == {2}


def _copy(in_spec, out_spec, grid, shape=(32, 32), scratch=(), **kw):
    def kernel(x_ref, o_ref, *scratch_refs):
        o_ref[...] = x_ref[...]

    return lambda x: pl.pallas_call(kernel, SDS(shape, jnp.float32), grid=grid,
                                    in_specs=[in_spec], out_specs=out_spec,
                                    scratch_shapes=scratch, interpret=True, **kw)(x)


def test_an_index_map_mixing_grid_axes_is_not_split():
    spec = pl.BlockSpec((8, 32), lambda i, j: (i + j, 0))
    out = pl.BlockSpec((8, 32), lambda i, j: (i, 0))
    rule = _rule(_copy(spec, out, (2, 2)), SDS((32, 32), jnp.float32))
    assert rule.splittable == frozenset()
    assert "uses it other than as the block index" in rule.axis_reasons[0]


def test_a_block_that_does_not_tile_the_array_is_not_split():
    spec = pl.BlockSpec((8, 32), lambda i: (i, 0))
    rule = _rule(_copy(spec, spec, (3,), shape=(24, 32)), SDS((30, 32), jnp.float32))
    assert rule.dims[0] == (None, None) and rule.splittable == frozenset()
    assert "do not tile the dimension of size 30" in rule.dim_reasons[0][0]


def test_scratch_needs_declared_parallel_semantics():
    spec = pl.BlockSpec((8, 32), lambda i: (i, 0))
    scratch = [pl.ANY((8, 32), jnp.float32)]
    rule = _rule(_copy(spec, spec, (4,), scratch=scratch), SDS((32, 32), jnp.float32))
    assert rule.splittable == frozenset() and "scratch" in rule.axis_reasons[0]
    params = {"mosaic_tpu": {"dimension_semantics": ("parallel",)}}
    rule = _rule(_copy(spec, spec, (4,), scratch=scratch, compiler_params=params),
                 SDS((32, 32), jnp.float32))
    assert rule.splittable == {0}
    params = {"mosaic_tpu": {"dimension_semantics": ("arbitrary",)}}
    rule = _rule(_copy(spec, spec, (4,), compiler_params=params), SDS((32, 32), jnp.float32))
    assert "'arbitrary'" in rule.axis_reasons[0]


def test_sharding_gather_takes_three_modes():
    with pytest.raises(ValueError, match="sharding_gather mode must be one of"):
        pl.sharding_gather("loud")


def test_sharded_kernels_on_8_cpu_devices():
    backends = [b for b, mod in (("triton", "pallas_triton"), ("mosaic_gpu",
                "pallas_mosaic_gpu"), ("mosaic_tpu", "pallas_tpu"))
                if importlib.util.find_spec(mod) is not None]
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run([sys.executable, str(FIXTURE), ",".join(backends)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for name in ("matmul rows x columns", "flash attention batch x heads",
                 "flash attention q blocks", "elementwise 2-D mesh",
                 "matmul along k gathered", "sharding_gather error", "vmap", "grad",
                 "export"):
        assert any(ln.startswith(f"ok {name}") for ln in lines), (name, proc.stdout)
    for b in backends:
        for case in ("matmul", "elementwise", "flash"):
            assert any(ln.startswith(f"ok lowering {b} {case}") for ln in lines), (b, case)
    assert lines[-1] == "done"


def test_a_partitioned_kernel_across_two_processes():
    """jax.distributed over localhost (gloo CPU collectives), 2 processes x 2 devices."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = Path(__file__).parent / "fixtures" / "sharded_multiprocess.py"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, str(script), str(i), str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=180))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"ok {i}" in out, (i, out[-2000:], err[-3000:])


def test_the_gspmd_partitioner_gets_the_same_rule():
    """With ``jax_use_shardy_partitioner=False`` the inference and partition callbacks
    split and gather the same way (matmul, attention, 2-D elementwise, k gathered)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(FIXTURE), "", "gspmd"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for name in ("matmul rows x columns", "flash attention batch x heads",
                 "elementwise 2-D mesh", "matmul along k gathered", "sharding_gather error"):
        assert any(ln.startswith(f"ok {name}") for ln in lines), (name, proc.stdout)
    assert lines[-1] == "done"


def test_the_per_device_tpu_kernel_compiles_for_a_deviceless_v5e_2x2():
    """libtpu (pallas-tpu[compile]) compiles the per-device matmul: local shapes, no
    all-gather. (The whole-program compile cannot be checked here: libtpu takes no
    custom-partitioning callbacks for a deviceless topology.)"""
    for mod in ("libtpu", "pallas_tpu"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed (pip install 'pallas-tpu[compile]')")
    script = Path(__file__).parent / "fixtures" / "sharded_tpu_topology.py"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    calls = [ln for ln in proc.stdout.splitlines() if ln.startswith("call ")]
    # x (512, 256) by rows over 2, y (256, 512) by columns over 2: 256x256 blocks each.
    assert calls and all(c.count("f32[256,256]") == 3 for c in calls), proc.stdout
    assert "all-gather False" in proc.stdout, proc.stdout
