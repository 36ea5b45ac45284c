"""Several devices in GPU interpret mode: the calls of one kernel on the devices of a
``shard_map`` share a :class:`DeviceGroup`.

XLA:CPU runs each device's part of a ``shard_map`` on its own thread, so each device's
host callback arrives on its own thread, concurrently. The callbacks of one call (the
k-th call of a kernel on each device) join one group, keyed by the kernel and k, and
hand over their operands (numpy arrays). Device 0's callback then simulates every
device at once: each device's :class:`~.thread.Launch` (its GMEM operands and symmetric
allocations, addressable by device id) and the threads of all of them in one
cooperative scheduler (so a deadlock across devices is found as within one), and hands
each callback its outputs; an error aborts the waiting callbacks. Only that one thread
runs JAX operations: JAX work dispatched from another device's callback thread to the
CPU device executing device 0's part would wait for device 0's callback to return.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from pallas import DeviceIdType
from pallas.plugins import DeviceGroups
from pallas_mosaic_gpu._src.cluster import PeerMemRef, PeerTransform, _ClusterRef
from pallas_mosaic_gpu._src.interpret import pairs

#: How long a device waits at the start for the other devices' callbacks (seconds).
START_TIMEOUT = 600.0


class SimulationAborted(RuntimeError):
    """Raised on a device whose group was aborted by another device's error."""


def mesh_axes() -> tuple[tuple[str, int], ...]:
    """((name, size), ...) of the manual axes of the enclosing ``shard_map``, if any."""
    am = jax.sharding.get_abstract_mesh()
    names = tuple(getattr(am, "axis_names", ()) or ())
    manual = set(getattr(am, "manual_axes", ()) or ())
    return tuple((n, int(am.axis_sizes[i])) for i, n in enumerate(names) if n in manual)


class DeviceGroup:
    """What the devices of one kernel call share (see the module docstring)."""

    def __init__(self, name: str, axes: tuple[tuple[str, int], ...]):
        self.name = name
        self.names = tuple(n for n, _ in axes)
        self.sizes = tuple(s for _, s in axes)
        self.num_devices = math.prod(self.sizes)
        self.cond = threading.Condition()
        self.launches: dict = {}
        self.prepares: dict = {}
        self.results: dict | None = None
        self.arrived = 0
        self.failed: BaseException | None = None
        self.failed_where = ""
        self.clocks = None
        self.detector = None
        # Its key among the running groups (set by ``DeviceGroups.join``, which made it).
        self.registry_key: tuple | None = None

    # -- device ids ----------------------------------------------------------------------
    def coords(self, device: int) -> dict[str, int]:
        out, rest = {}, int(device)
        for n, s in reversed(list(zip(self.names, self.sizes))):
            out[n] = rest % s
            rest //= s
        return {n: out[n] for n in self.names}

    def device_of(self, coords: dict) -> int:
        dev = 0
        for n, s in zip(self.names, self.sizes):
            dev = dev * s + int(coords[n])
        return dev

    def peer(self, me: int, device_id, device_id_type, what: str) -> int:
        """The device a ``device_id`` argument names (see ``pallas.DeviceIdType``)."""
        mesh = dict(zip(self.names, self.sizes))
        if isinstance(device_id, dict):
            unknown = [a for a in device_id if a not in self.names]
            if unknown:
                raise ValueError(f"{what}: device_id names axes {unknown}, not axes of the "
                                 f"mesh {mesh}")
            coords = {**self.coords(me), **{a: int(v) for a, v in device_id.items()}}
        elif isinstance(device_id, (tuple, list)):
            if len(device_id) != len(self.names):
                raise ValueError(f"{what}: device_id has {len(device_id)} indices for the "
                                 f"mesh {mesh}; give one per axis or {{axis: index}}")
            coords = {a: int(v) for a, v in zip(self.names, device_id)}
        elif device_id_type == DeviceIdType.LOGICAL or len(self.names) <= 1:
            dev = int(device_id)
            if not 0 <= dev < self.num_devices:
                raise ValueError(f"{what}: device_id {dev} is out of range for the "
                                 f"{self.num_devices} device(s) of the mesh {mesh}")
            return dev
        else:
            raise ValueError(f"{what}: a scalar device_id ({int(device_id)}) on the mesh "
                             f"{mesh} of several axes; give {{axis: index}} or "
                             "device_id_type=LOGICAL")
        bad = {a: v for a, v in coords.items() if not 0 <= v < mesh[a]}
        if bad:
            raise ValueError(f"{what}: device_id {device_id} is out of range for the mesh "
                             f"{mesh}")
        return self.device_of(coords)

    def along(self, me: int, axes: Sequence[str], what: str) -> list[int]:
        """The devices that share ``me``'s coordinates except along ``axes``."""
        unknown = [a for a in axes if a not in self.names]
        if unknown:
            raise ValueError(f"{what}: collective axes {unknown} are not axes of the "
                             f"enclosing shard_map's mesh {dict(zip(self.names, self.sizes))}")
        mine = self.coords(me)
        return [d for d in range(self.num_devices)
                if all(c == mine[a] for a, c in self.coords(d).items() if a not in axes)]

    # -- running -----------------------------------------------------------------------
    def check_failed(self) -> None:
        if self.failed is not None:
            raise SimulationAborted(
                f"GPU interpret mode: the kernel {self.name} was aborted because "
                f"{self.failed_where} failed: {type(self.failed).__name__}: {self.failed}")

    def fail(self, exc: BaseException, where: str) -> None:
        with self.cond:
            if self.failed is None and not isinstance(exc, SimulationAborted):
                self.failed, self.failed_where = exc, where
            self.cond.notify_all()

    def _wait(self, done: Callable[[], bool], device: int, what: str) -> None:
        waited = 0.0
        while not done():
            self.check_failed()
            if waited >= START_TIMEOUT:
                raise RuntimeError(
                    f"GPU interpret mode: device {device} of kernel {self.name} waited "
                    f"{START_TIMEOUT:.0f}s for {what} (only {self.arrived} of "
                    f"{self.num_devices} devices' callbacks arrived); XLA did not run the "
                    "devices of the shard_map concurrently")
            self.cond.wait(timeout=1.0)
            waited += 1.0

    def run(self, device: int, prepare: Callable, simulate: Callable) -> list:
        """This device's outputs. Device 0 simulates every device (see the module
        docstring) once all arrived: ``prepare(group, d)`` builds device d's launch and
        returns (launch, threads, collect); ``simulate(threads, launches)`` runs them."""
        with self.cond:
            self.prepares[device] = prepare
            self.arrived += 1
            self.cond.notify_all()
            if device != 0:
                self._wait(lambda: self.results is not None, device, "device 0's simulation")
                return self.results[device]
            self._wait(lambda: self.arrived >= self.num_devices, device, "the other devices")
        try:
            built = {d: self.prepares[d](self, d) for d in range(self.num_devices)}
            simulate([t for _, threads, _ in built.values() for t in threads],
                     [launch for launch, _, _ in built.values()])
            results = {d: collect() for d, (_, _, collect) in built.items()}
        except BaseException as e:
            self.fail(e, "device 0's simulation of every device")
            raise
        with self.cond:
            self.results = results
            self.cond.notify_all()
        return results[0]


def where(coords: dict) -> str:
    return ", ".join(f"{n}={i}" for n, i in coords.items())


# -- the registry of running groups -------------------------------------------------------

#: The running groups: ``GROUPS.join(kernel_key, device, make)`` is the group of this
#: device's next call of the kernel, ``GROUPS.leave(group)`` when the device is done.
GROUPS = DeviceGroups()


def reset_all() -> None:
    """Forgets every group (after an error left one behind), aborting its devices."""
    GROUPS.reset(SimulationAborted("reset_gpu_interpret_mode_state()"))


# -- remote refs ------------------------------------------------------------------------


@functools.lru_cache(maxsize=512)
def _peer_kinds(tree) -> frozenset:
    """Which memory-redirecting transforms a ref view's transforms hold: "device"
    (``remote_ref``), "multicast" (``multicast_ref``), "cluster" (``cluster_ref``)."""
    if tree is None:
        return frozenset()
    transforms = jax.tree_util.tree_unflatten(tree, [0] * tree.num_leaves)
    return frozenset(
        "device" if isinstance(t, PeerMemRef) else
        "cluster" if isinstance(t, _ClusterRef) else "multicast"
        for t in transforms if isinstance(t, PeerTransform))


def has_peer(tree) -> bool:
    """Whether a ref view reaches other devices (``remote_ref``, ``multicast_ref``)."""
    return bool(_peer_kinds(tree) & {"device", "multicast"})


def _on_cluster_block(th, buf, t, what: str):
    """``buf`` in the block of ``th``'s cluster that a ``cluster_ref`` names."""
    for axis, index in zip(t.axes, t.block_ids):
        index = int(jnp.asarray(index))
        _, size = pairs.rank(th, axis, what + " through plgpu.cluster_ref")
        if not 0 <= index < size:
            raise ValueError(f"{what} through plgpu.cluster_ref: block {axis}={index} is "
                             f"out of range for the cluster's {size} blocks along {axis!r}")
        buf = pairs.peer_buffer(th, buf, axis, index)
    return buf


def resolve_all(th, buf, flat, tree, what: str) -> list:
    """Every ``(buffer, flat, tree)`` an access through a ref view touches: for a
    ``plgpu.remote_ref`` view, the named device's copy of ``buf``; for a
    ``plgpu.cluster_ref`` view, the named block's copy; for a ``plgpu.multicast_ref``
    view, the copy on every device along its axes (in device order)."""
    kinds = _peer_kinds(tree)
    if not kinds:
        return [(buf, flat, tree)]
    transforms = jax.tree_util.tree_unflatten(tree, list(flat))
    peers = [t for t in transforms if isinstance(t, PeerTransform)]
    if sum(not isinstance(t, _ClusterRef) for t in peers) > 1:
        raise ValueError(f"{what}: a ref made remote or multicast twice "
                         "(plgpu.remote_ref, plgpu.multicast_ref)")
    rest = [t for t in transforms if not isinstance(t, PeerTransform)]
    flat, tree = jax.tree_util.tree_flatten(rest)
    bufs = [buf]
    for t in peers:
        if isinstance(t, _ClusterRef):
            bufs = [_on_cluster_block(th, b, t, what) for b in bufs]
        elif isinstance(t, PeerMemRef):
            dev = peer_device(th, t.device_id, t.device_id_type, what)
            bufs = [copy_on(th, dev, b, what) for b in bufs]
        else:
            devs = devices_along(th, t.collective_axes, what + " through plgpu.multicast_ref")
            bufs = [copy_on(th, d, b, what) for b in bufs for d in devs]
    return [(b, flat, tree) for b in bufs]


def resolve(th, buf, flat, tree, what: str):
    """The ``(buffer, flat, tree)`` an access through a ref view touches (see
    :func:`resolve_all`); a ``plgpu.multicast_ref`` view is refused: upstream writes
    through one only with ``copy_smem_to_gmem`` (a TMA store to every device)."""
    if "multicast" in _peer_kinds(tree):
        raise NotImplementedError(
            f"{what} through plgpu.multicast_ref: only plgpu.copy_smem_to_gmem stores to "
            "a multicast ref (to every device along its axes), as upstream's lowering; "
            "use plgpu.multimem_store / multimem_load_reduce for loads and stores")
    (out,) = resolve_all(th, buf, flat, tree, what)
    return out


def peer_device(th, device_id, device_id_type, what: str) -> int:
    launch = th.launch
    device_id = jax.tree_util.tree_map(lambda x: int(jnp.asarray(x)), device_id)
    if launch.group is None:
        group = DeviceGroup(launch.name, ())
        return group.peer(0, device_id, device_id_type, what)
    return launch.group.peer(launch.device, device_id, device_id_type, what)


def devices_along(th, axes, what: str) -> list[int]:
    launch = th.launch
    if launch.group is None:
        return [launch.device]  # a single device along any axes
    return launch.group.along(launch.device, axes, what)


def copy_on(th, device: int, buf, what: str):
    """Device ``device``'s copy of the symmetric allocation ``buf`` (``th``'s own)."""
    launch = th.launch
    if device == launch.device:
        return buf
    if buf.sym is None:
        raise ValueError(
            f"{what}: {buf.name} is not addressable on another device (only kernel "
            "operands and outputs, kernel scratch, run_scoped and pl.get_global "
            "allocations are, as symmetric memory)")
    target = launch.group.launches[device]
    if buf.sym[0] == "__global__":
        return target.global_buffer(buf.sym, buf.memref)
    return target.materialize(buf)
