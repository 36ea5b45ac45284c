"""``pl.emulate_device`` and ``PALLAS_EMULATE_DEVICE``: the valid devices, the error for
any other, and what each device answers (the backends' tests run kernels on them)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import pallas as pl
import pallas.plugins

VALID = ("tpu:v4", "tpu:v5e", "tpu:v5p", "tpu:v6e", "tpu:7x", "cuda:sm_80", "cuda:sm_90a",
         "cuda:sm_100a", "rocm:gfx942")


def test_every_documented_device_is_valid_and_nothing_else():
    for spec in VALID:
        with pl.emulate_device(spec) as dev:
            assert pallas.plugins.emulated_device() is dev and dev.spec == spec
    assert pallas.plugins.emulated_device() is None
    for bad in ("tpu:v9", "cuda:sm_70", "gpu", "rocm:gfx90a"):
        with pytest.raises(ValueError, match="valid values are tpu:v4, tpu:v5e"):
            pl.emulate_device(bad)  # raised at once, not on entering the block


def test_none_turns_emulation_off_inside_a_block():
    with pl.emulate_device("tpu:v5e"):
        with pl.emulate_device(None) as dev:
            assert dev is None and pallas.plugins.emulated_device() is None
        assert pallas.plugins.emulated_device().target == "v5e"


def test_gpu_figures():
    with pl.emulate_device("cuda:sm_90a") as dev:
        assert dev.compute_capability == (9, 0) and dev.sm_count == 132
        assert dev.smem_bytes_per_block == 232448
        assert dev.compile_options() == {"target": "sm_90a", "compute_capability": 90}
    with pl.emulate_device("rocm:gfx942") as dev:  # an MI300X: compute units, LDS
        assert dev.compute_capability is None and dev.sm_count == 304
        assert dev.smem_bytes_per_block == 65536
        assert dev.compile_options() == {"platform": "rocm", "target": "gfx942"}
    with pl.emulate_device("tpu:v5p") as dev:
        assert dev.sm_count == 0 and dev.compile_options()["chip"] == "v5p"


def test_a_bad_environment_variable_names_itself():
    code = "import pallas.plugins as p; p.emulated_device()"
    env = {**os.environ, "PALLAS_EMULATE_DEVICE": "tpu:v3", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "PALLAS_EMULATE_DEVICE: 'tpu:v3' is not an emulated device" in proc.stderr


def test_a_cpu_device_answers_the_emulated_devices_core_counts():
    """Kernels size their grids from ``jax.devices()[0].core_count`` (a GPU's SMs) or
    ``.num_cores`` (a TPU's TensorCores): a CPU device answers them while, and only
    while, a device of that platform is emulated."""
    import jax

    cpu = jax.devices("cpu")[0]
    assert not hasattr(cpu, "core_count") and not hasattr(cpu, "num_cores")
    with pl.emulate_device("cuda:sm_90a"):
        assert cpu.core_count == 132 and not hasattr(cpu, "num_cores")
    with pl.emulate_device("rocm:gfx942"):
        assert cpu.core_count == 304
    with pl.emulate_device("tpu:v5p"):
        assert cpu.num_cores == 2 and not hasattr(cpu, "core_count")
    with pl.emulate_device("tpu:v5e"):
        assert cpu.num_cores == 1
        with pl.emulate_device(None):
            assert not hasattr(cpu, "num_cores")
    assert not hasattr(cpu, "core_count") and not hasattr(cpu, "num_cores")
    assert cpu.platform == "cpu"  # the device's own attributes are untouched
