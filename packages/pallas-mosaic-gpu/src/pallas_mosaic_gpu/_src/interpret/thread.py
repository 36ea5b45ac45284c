"""What the threads of one launch share (:class:`Launch`) and what each one owns
(:class:`ThreadCtx`): coordinates, vector-clock entry, pending TMA store groups."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from pallas.plugins import Access, RaceDetector, VectorClocks, is_semaphore_space
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.interpret.memory import Buffer, fill_value, whole
from pallas_mosaic_gpu._src.interpret.sync import BarrierArray, SemaphoreArray
from pallas_mosaic_gpu._src.memory import BarrierSpace
from pallas_mosaic_gpu._src.mesh import Mesh as GpuMesh


class Launch:
    """One kernel launch on one device: its mesh, shared allocations, clocks, races.

    Vector-clock entries: one per thread of the mesh, then one per simulated TMA unit
    (on several devices, each device's entries from ``clock_base`` in the clocks the
    devices share). ``symmetric`` holds the allocations other devices can address.
    """

    def __init__(self, params, *, axis_names, sizes, mesh, outer_axes, num_threads, report,
                 name, group=None, device: int = 0):
        self.params = params
        self.axis_names = tuple(axis_names)
        self.sizes = tuple(sizes)
        self.mesh = mesh
        self.outer_axes = outer_axes
        self.num_threads = num_threads
        self.name = name
        self.grid: tuple = self.sizes
        self.thread_axis = mesh.thread_name if isinstance(mesh, GpuMesh) else None
        self.cluster_axes = tuple(mesh.cluster_names) if isinstance(mesh, GpuMesh) else ()
        self.num_tma = params.num_tma_threads_per_device
        self.tma_next = 0
        self.group = group
        self.device = device
        per_device = num_threads + self.num_tma
        self.clock_base = device * per_device
        if not params.detect_races:
            self.clocks = None
            self.detector = None
        elif group is None:
            self.clocks = VectorClocks(per_device)
            self.detector = RaceDetector(report)
        else:  # one clock space for every device (remote accesses, remote signals)
            if group.clocks is None:
                group.clocks = VectorClocks(group.num_devices * per_device)
                group.detector = RaceDetector(report)
            self.clocks, self.detector = group.clocks, group.detector
        self.shared: dict = {}
        self.symmetric: dict = {}
        self.barriers: list[Buffer] = []
        # tcgen05 arrivals per issuing thread, and the latest one some thread observed
        self.tc_issued: dict[int, int] = {}
        self.tc_observed: dict[int, int] = {}

    def tma_unit(self) -> int:
        """The clock entry of the TMA unit that takes the next copy (round robin)."""
        unit = self.clock_base + self.num_threads + self.tma_next % self.num_tma
        self.tma_next += 1
        return unit

    def register(self, buf: Buffer, sym) -> Buffer:
        """Makes ``buf`` addressable by other devices as the allocation ``sym``."""
        buf.sym = sym
        self.symmetric[sym] = buf
        return buf

    def global_buffer(self, key, memref) -> Buffer:
        """The launch's ``pl.get_global`` buffer ``key`` (made on first use)."""
        if key not in self.shared:
            buf = self.new_buffer(memref, f"pl.get_global buffer ({memref.memory_space})",
                                  group=())
            self.shared[key] = self.register(buf, key)
        return self.shared[key]

    def materialize(self, like: Buffer) -> Buffer:
        """This launch's copy of the symmetric allocation ``like`` (another device's),
        made now if this device's threads have not reached it yet: symmetric memory
        exists on every device for the whole launch."""
        buf = self.symmetric.get(like.sym)
        if buf is None:
            if like.memref is None:
                raise RuntimeError(f"{like.name} does not exist on device {self.device}")
            buf = self.new_buffer(like.memref, like.name, group=like.group)
            if like.group is not None:
                self.shared[like.sym] = buf
            self.register(buf, like.sym)
        return buf

    def new_buffer(self, memref, name: str, group=None) -> Buffer:
        buf = self._new_buffer(memref, name, group)
        buf.memref = memref
        return buf

    def _new_buffer(self, memref, name: str, group=None) -> Buffer:
        space = memref.memory_space
        shape, dtype = tuple(memref.shape), memref.dtype
        if isinstance(space, BarrierSpace):
            blocks = 1
            if space.kind == "cluster_barrier":
                sizes = dict(zip(self.axis_names, self.sizes))
                for axes in space.collective_axes:
                    for a in ((axes,) if isinstance(axes, str) else axes):
                        blocks *= sizes[a]
            buf = Buffer(name, space, jnp.zeros(shape, jnp.int32),
                         sync=BarrierArray(shape, space, blocks), group=group)
            self.barriers.append(buf)
            return buf
        if is_semaphore_space(space):
            return Buffer(name, space, jnp.zeros(shape, dtype), sync=SemaphoreArray(shape),
                          group=group)
        initial = getattr(memref, "initial_value", None)
        if callable(initial):
            value = jnp.broadcast_to(jnp.asarray(initial(), dtype), shape)
        else:
            value = jnp.full(shape, fill_value(dtype, self.params.uninitialized_memory))
        return Buffer(name, space, value, group=group)

    def allocate(self, th: ThreadCtx, memref, name: str, site: Any,
                 collective_axes: tuple) -> Buffer:
        """A buffer for ``th``: its own, or the one shared by every thread that agrees
        with it on the axes outside ``collective_axes`` (and has run ``site`` as often)."""
        if hasattr(memref, "get_memory_ref"):
            memref = memref.get_memory_ref()
        count = th.occurrences.get(site, 0)
        th.occurrences[site] = count + 1
        space = memref.memory_space
        if isinstance(space, BarrierSpace) and space.kind == "cluster_barrier":
            # Every arrival reaches the barrier of each block of the cluster along its
            # axes, so those copies go through the same phases: one shared state.
            cluster = tuple(a for axes in space.collective_axes
                            for a in ((axes,) if isinstance(axes, str) else axes))
            missing = [a for a in cluster if a not in self.axis_names]
            if missing:
                raise ValueError(f"plgpu.ClusterBarrier(collective_axes={cluster}): axes "
                                 f"{missing} are not axes of the kernel {self.axis_names}")
            collective_axes = (*collective_axes, *cluster)
        if not collective_axes:
            sym = (site, count, th.point)
            buf = self.symmetric.get(sym)  # made already by another device's access
            return buf if buf is not None else self.register(self.new_buffer(memref, name),
                                                             sym)
        group = tuple((n, th.coords[n]) for n in self.axis_names if n not in collective_axes)
        key = (site, count, group)
        buf = self.shared.get(key)
        if buf is None:
            buf = self.shared[key] = self.register(self.new_buffer(memref, name, group=group),
                                                   key)
        return buf


class ThreadCtx:
    """One simulated thread (a warpgroup) at ``point`` of the launch's mesh."""

    def __init__(self, launch: Launch, tid: int, point: tuple[int, ...]):
        self.launch = launch
        self.tid = tid
        self.entry = launch.clock_base + tid  # its vector-clock entry
        self.point = point
        self.coords = dict(zip(launch.axis_names, point))
        self.axis_names = launch.axis_names
        self.grid_indices = point
        self.grid = launch.grid
        self.occurrences: dict = {}
        self.site_eqn = None
        self.store_groups: list = []  # clocks of committed, unwaited SMEM->GMEM groups
        self.open_group: list = []  # clocks of stores not yet in a committed group
        if launch.thread_axis is not None:
            self.thread_index = self.coords[launch.thread_axis]
        else:
            self.thread_index = 0
        where = ", ".join(f"{n}={i}" for n, i in self.coords.items())
        self.name = f"thread ({where})" if where else "thread"
        if launch.group is not None:
            coords = launch.group.coords(launch.device)
            self.name += f" of device {launch.device} ({', '.join(f'{n}={i}' for n, i in coords.items())})"

    @property
    def site(self) -> str:
        return jc.source_site(self.site_eqn) if self.site_eqn is not None else "<kernel>"

    def access(self, buf: Buffer, kind: str, region=None, unit: int | None = None,
               who: str | None = None) -> None:
        """Logs an access of ``buf`` for the race detector (by TMA ``unit`` if given)."""
        launch = self.launch
        if launch.detector is None or buf.sync is not None:
            return
        entry = self.entry if unit is None else unit
        clock = launch.clocks.tick(entry)
        if region is None:
            region = whole(buf.shape)
        tma = unit - launch.clock_base - launch.num_threads if unit is not None else 0
        who = who or (self.name if unit is None else f"TMA unit {tma} "
                      f"(copy issued by {self.name})")
        launch.detector.record(buf.key, Access(entry, clock, kind, region, self.site, who),
                               buf.name)

    def release(self) -> np.ndarray | None:
        """This thread's clock to hand to a synchronisation object (ticks first)."""
        clocks = self.launch.clocks
        return None if clocks is None else clocks.release(self.entry)

    def acquire(self, clock) -> None:
        if self.launch.clocks is not None:
            self.launch.clocks.acquire(self.entry, clock)
