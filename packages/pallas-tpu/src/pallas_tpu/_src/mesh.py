"""``create_tensorcore_mesh`` and ``run_on_first_core``: running a kernel on every
TensorCore of a chip with ``pl.kernel``.

A ``TensorCoreMesh`` has one axis (named by the user) whose size is the number of
TensorCores of a logical device (2 on megacore chips, 1 otherwise; 1 on CPU). ``pl.kernel``
turns it into a ``pallas_call`` whose grid is the mesh: in the interpreter the cores run
one after the other; for TPU the axis lowers as ``core_parallel`` and
``lax.axis_index(name)`` is the core's index.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from jax import lax

import pallas as pl
from pallas.plugins import Mesh
from pallas_tpu._src.compiler_params import CORE_PARALLEL, CompilerParams
from pallas_tpu._src.interpret.entry import discharge_core_map
from pallas_tpu._src.interpret.params import InterpretParams, forced_params
from pallas_tpu._src.memory import MemorySpace
from pallas_tpu._src.tpu_info import get_tpu_info, is_tpu_device


@dataclasses.dataclass(frozen=True)
class TensorCore:
    """One TensorCore of a logical TPU device (an entry of ``TensorCoreMesh.devices``)."""

    id: int


@dataclasses.dataclass(frozen=True)
class TensorCoreMesh(Mesh):
    """The TensorCores of a logical TPU device, along one named axis."""

    axis_name: str
    num_cores: int
    devices: Any = None

    backend = "mosaic_tpu"
    default_memory_space = MemorySpace.ANY
    scalar_memory_space = MemorySpace.SMEM  # captured scalars (pl.kernel) live in SMEM

    @property
    def shape(self) -> dict[str, int]:
        return {self.axis_name: self.num_cores}

    def kernel_compiler_params(self, compiler_params):
        """``pl.kernel`` on this mesh: its axis is core-parallel (one core per point)."""
        if compiler_params is None:
            return CompilerParams(dimension_semantics=(CORE_PARALLEL,))
        if isinstance(compiler_params, CompilerParams) and (
                compiler_params.dimension_semantics is None):
            return dataclasses.replace(compiler_params, dimension_semantics=(CORE_PARALLEL,))
        return compiler_params

    def discharge_core_map(self, interpret):
        """``core_map`` on this mesh outside a TPU: TPU interpret mode with ``interpret``
        (a ``pltpu.InterpretParams``), the forced params, or the defaults."""
        params = interpret if isinstance(interpret, InterpretParams) else (
            forced_params() or InterpretParams())
        return lambda in_avals, args, eqn_params: discharge_core_map(
            params, self, in_avals, args, eqn_params)


def create_tensorcore_mesh(axis_name: str, devices: Sequence[Any] | None = None,
                           num_cores: int | None = None) -> TensorCoreMesh:
    """A mesh over the TensorCores of one logical device (``num_cores`` defaults to the
    running TPU's, or 1 elsewhere)."""
    if devices is not None and num_cores is not None:
        raise ValueError("cannot specify both devices and num_cores")
    if num_cores is None and devices is not None and len(devices):
        num_cores = getattr(devices[0], "num_cores", None)
    if num_cores is None:
        num_cores = get_tpu_info().num_cores if is_tpu_device() else 1
    if int(num_cores) < 1:
        raise ValueError(f"num_cores must be >= 1; got {num_cores}")
    # As upstream, the mesh's devices are its TensorCores (``len(mesh.devices)`` is the
    # number of cores), whatever devices it was made from.
    return TensorCoreMesh(str(axis_name), int(num_cores),
                          tuple(TensorCore(i) for i in range(int(num_cores))))


def run_on_first_core(core_axis_name: str):
    """Decorator: runs the zero-argument function only on core 0 of ``core_axis_name``."""

    def decorator(f):
        pl.when(lax.axis_index(core_axis_name) == 0)(f)
        return f

    return decorator
