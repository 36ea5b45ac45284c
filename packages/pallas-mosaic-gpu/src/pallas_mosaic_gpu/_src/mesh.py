"""GPU meshes: ``plgpu.Mesh`` (grid x cluster x threads) and ``plgpu.WarpMesh``.

``lax.axis_index(name)`` in a kernel gives the block's coordinate along a grid or cluster
axis, or the thread (warpgroup) index along the thread axis. The axes are ordered grid,
cluster, thread.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pallas.plugins import Mesh as CoreMesh
from pallas_mosaic_gpu._src.memory import GMEM

MAX_THREADS = 2048 // 128  # each thread is a warpgroup of 128 CUDA threads

# GPU interpret mode's discharge of ``pl.core_map`` on a :class:`Mesh`:
# ``interpret.launch`` (which runs meshes, so sits above them) registers it when
# imported; ``_src.interpret`` imports it.
_CORE_MAP_INTERPRETER: list = []


def register_core_map_interpreter(discharge) -> None:
    """Sets ``discharge(mesh, interpret) -> simulate | None``, GPU interpret mode's
    ``pl.core_map`` on a mesh (None: ``interpret`` does not select it)."""
    _CORE_MAP_INTERPRETER[:] = [discharge]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mesh(CoreMesh):
    """Blocks on a ``grid`` (clustered by ``cluster``), each running ``num_threads``
    warpgroups; passing it to ``pl.core_map`` or ``pl.kernel`` selects Mosaic GPU."""

    grid: Sequence[int] = ()
    grid_names: Sequence[str] = ()
    cluster: Sequence[int] = ()
    cluster_names: Sequence[str] = ()
    num_threads: int | None = None
    thread_name: str | None = None
    kernel_name: str | None = None

    backend: ClassVar[str] = "mosaic_gpu"

    def __post_init__(self):
        if len(self.cluster) > 3:
            raise ValueError(f"cluster= must be at most 3D, got {self}.")
        if len(self.grid_names) != len(self.grid):
            raise ValueError(f"grid_names must have the same length as grid, got {self}.")
        if len(self.cluster_names) != len(self.cluster):
            raise ValueError(
                f"cluster_names must have the same length as cluster, got {self}.")
        if (self.thread_name is None) != (self.num_threads is None):
            raise ValueError(
                f"num_threads and thread_name must be either both set or both None, got {self}")
        if self.num_threads is not None and self.num_threads > MAX_THREADS:
            raise ValueError(
                "Requested too many CUDA threads per block. Each Mosaic thread corresponds to "
                f"128 CUDA threads. At most {MAX_THREADS} are supported, got {self}")
        for f in ("grid", "grid_names", "cluster", "cluster_names"):
            object.__setattr__(self, f, tuple(getattr(self, f)))

    @property
    def default_memory_space(self):
        return GMEM

    def discharge_core_map(self, interpret: Any):
        """``pl.core_map`` on this mesh outside a kernel runs in GPU interpret mode when
        ``interpret`` is ``plgpu.InterpretParams`` or ``True`` (its threads may wait for
        each other, which the reference interpreter cannot run): the ``simulate``
        function GPU interpret mode registered (:func:`register_core_map_interpreter`)
        gives, or None."""
        (discharge,) = _CORE_MAP_INTERPRETER
        return discharge(self, interpret)

    @property
    def shape(self) -> Mapping[str, int]:
        names = (*self.grid_names, *self.cluster_names)
        sizes = (*self.grid, *self.cluster)
        if self.num_threads is not None:
            names, sizes = (*names, self.thread_name), (*sizes, self.num_threads)
        return dict(zip(names, (int(s) for s in sizes)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarpMesh(CoreMesh):
    """The 4 warps of a warpgroup, for ``pl.core_map`` inside a kernel
    (``lax.axis_index(axis_name)`` is the warp index)."""

    NUM_WARPS_PER_WARPGROUP: ClassVar[int] = 4
    axis_name: str

    backend: ClassVar[str] = "mosaic_gpu"

    @property
    def shape(self) -> Mapping[str, int]:
        return {self.axis_name: self.NUM_WARPS_PER_WARPGROUP}

    @property
    def default_memory_space(self):
        raise NotImplementedError("plgpu.WarpMesh has no default memory space")
