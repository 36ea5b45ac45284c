"""``VectorSubcoreMesh`` and ``ScalarSubcoreMesh``: running a kernel on SparseCores.

``pl.kernel(body, out_type, mesh=plsc.VectorSubcoreMesh(...))`` runs ``body`` once per
(core, subcore) pair; ``lax.axis_index(core_axis_name)`` and
``lax.axis_index(subcore_axis_name)`` say which. A ``ScalarSubcoreMesh`` runs it once
per SparseCore, on its scalar subcore. Operands arrive whole, in HBM. Both meshes select
the ``mosaic_sparsecore`` backend. In the interpreter the mesh points run one after the
other in row-major order (core-major), so results are deterministic; a vector-subcore
kernel that uses ``subcore_barrier`` or ``VMEM_SHARED`` runs its subcores as coroutines
that meet at the barriers instead (see ``_src/subcores.py``).
"""

from __future__ import annotations

import collections
import dataclasses
import math

import pallas as pl
from pallas.plugins import Mesh
from pallas_tpu import CORE_PARALLEL, SUBCORE_PARALLEL, CoreType, MemorySpace
from pallas_tpu_sparsecore._src import subcores
from pallas_tpu_sparsecore._src.info import current_chip, get_sparse_core_info

BACKEND = "mosaic_sparsecore"


def _check_count(what: str, value, limit: int, unit: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int; got {value!r}")
    if value < 1:
        raise ValueError(f"{what} must be >= 1; got {value}")
    if value > limit:
        raise ValueError(
            f"{what}={value}, but the target TPU {current_chip()} has only {limit} "
            f"{unit}; valid: 1..{limit}"
        )
    return value


def _check_name(what: str, name) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"{what} must be a non-empty str; got {name!r}")


class _SparseCoreMesh(Mesh):
    """What both SparseCore meshes share: the backend they select, operands in HBM, and
    one kernel instance per mesh point; ``core_type`` says which subcores run it."""

    backend = BACKEND
    default_memory_space = MemorySpace.HBM
    core_type: CoreType

    @property
    def size(self) -> int:
        return math.prod(self.sizes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScalarSubcoreMesh(_SparseCoreMesh):
    """One mesh point per SparseCore (its scalar subcore), along ``axis_name``."""

    axis_name: str
    num_cores: int = dataclasses.field(
        default_factory=lambda: get_sparse_core_info().num_cores)

    core_type = CoreType.SC_SCALAR_SUBCORE

    def __post_init__(self):
        _check_name("ScalarSubcoreMesh axis_name", self.axis_name)
        _check_count("ScalarSubcoreMesh num_cores", self.num_cores,
                     get_sparse_core_info().num_cores, "SparseCores")

    @property
    def shape(self) -> collections.OrderedDict:
        return collections.OrderedDict({self.axis_name: self.num_cores})

    @property
    def dimension_semantics(self) -> list:
        return [CORE_PARALLEL]


@dataclasses.dataclass(frozen=True, kw_only=True)
class VectorSubcoreMesh(_SparseCoreMesh):
    """One mesh point per vector subcore: ``num_cores`` SparseCores times
    ``num_subcores`` subcores, along ``core_axis_name`` and ``subcore_axis_name``."""

    core_axis_name: str
    subcore_axis_name: str
    num_cores: int = dataclasses.field(
        default_factory=lambda: get_sparse_core_info().num_cores)
    num_subcores: int = dataclasses.field(
        default_factory=lambda: get_sparse_core_info().num_subcores)

    core_type = CoreType.SC_VECTOR_SUBCORE

    def __post_init__(self):
        _check_name("VectorSubcoreMesh core_axis_name", self.core_axis_name)
        _check_name("VectorSubcoreMesh subcore_axis_name", self.subcore_axis_name)
        if self.core_axis_name == self.subcore_axis_name:
            raise ValueError(
                f"VectorSubcoreMesh core_axis_name and subcore_axis_name must differ; "
                f"both are {self.core_axis_name!r}")
        info = get_sparse_core_info()
        _check_count("VectorSubcoreMesh num_cores", self.num_cores, info.num_cores,
                     "SparseCores")
        _check_count("VectorSubcoreMesh num_subcores", self.num_subcores,
                     info.num_subcores, "vector subcores per SparseCore")

    @property
    def shape(self) -> collections.OrderedDict:
        return collections.OrderedDict(
            {self.core_axis_name: self.num_cores, self.subcore_axis_name: self.num_subcores})

    @property
    def dimension_semantics(self) -> list:
        return [CORE_PARALLEL, SUBCORE_PARALLEL]

    def discharge_core_map(self, interpret):
        """``pl.core_map`` over this mesh outside a kernel runs its subcores as
        coroutines meeting at barriers (``_src/subcores.py``), in the interpreter; a
        backend interpret mode (e.g. ``pltpu.InterpretParams``) keeps its own."""
        if interpret is not None and not isinstance(interpret, (bool, pl.InterpretParams)):
            return None

        return lambda in_avals, args, params: subcores.run_core_map(self, in_avals, args,
                                                                    params)
