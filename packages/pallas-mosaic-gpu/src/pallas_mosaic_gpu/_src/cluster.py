"""Refs of other blocks and devices, cluster launch control, and multi-device memory.

``remote_ref``/``cluster_ref``/``multicast_ref`` view a ref through a transform that
names another device or block; ``semaphore_signal_parallel`` signals several semaphores;
``try_cluster_cancel``/``query_cluster_cancel`` implement dynamic work stealing (in the
interpreters no launch is ever cancelled: every block runs, which is one valid GPU
schedule). GPU interpret mode gives ``remote_ref``/``multicast_ref`` views the memory of
other devices and ``cluster_ref`` views (and ``async_store_smem``, in
``primitives/cluster_store.py``) another block's SMEM.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import pallas as pl
from pallas import DeviceIdType
from pallas_mosaic_gpu._src import jax_compat as jc
from pallas_mosaic_gpu._src.memory import SMEM
from pallas_mosaic_gpu._src.primitives.barriers import barrier_arrive, check_barrier
from pallas_mosaic_gpu._src.primitives.cluster_store import async_store_smem  # noqa: F401


class PeerTransform:
    """Base of the transforms that make a ref name another device's or block's memory."""

    def transform_type(self, x):
        return x

    def transform_shape(self, shape):
        return shape

    def transform_dtype(self, dtype):
        return dtype

    def pretty_print(self, context) -> Any:
        """How a kernel jaxpr prints the transform (JAX's printer of ref operations)."""
        del context
        return jc.pretty_printer.text(f"{{{type(self).__name__.lstrip('_')}}}")

    def tree_flatten(self):
        return (), self

    @classmethod
    def tree_unflatten(cls, aux, children):
        return aux


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class PeerMemRef(PeerTransform):
    """The same buffer on device ``device_id`` (see ``remote_ref``): an int32 scalar, or
    a mapping of mesh axes to ones (``{"x": 1 - lax.axis_index("x")}``)."""

    device_id: Any
    device_id_type: DeviceIdType

    def tree_flatten(self):
        leaves, tree = jax.tree_util.tree_flatten(self.device_id)
        return tuple(leaves), (tree, self.device_id_type)

    @classmethod
    def tree_unflatten(cls, aux, children):
        tree, device_id_type = aux
        return cls(jax.tree_util.tree_unflatten(tree, list(children)), device_id_type)


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class _MulticastRef(PeerTransform):
    collective_axes: tuple

    def tree_flatten(self):
        return (), self.collective_axes

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(aux)


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class _ClusterRef(PeerTransform):
    axes: tuple
    block_ids: tuple

    def tree_flatten(self):
        return tuple(self.block_ids), self.axes

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(aux, tuple(children))


def _with(ref: Any, transform: Any) -> Any:
    if not isinstance(ref, jc.TransformedRef):
        if not isinstance(jax.typeof(ref), jc.AbstractRef):
            raise TypeError(f"expected a ref, got {jax.typeof(ref).str_short()}")
        ref = jc.TransformedRef(ref, ())
    return jc.TransformedRef(ref.ref, (*ref.transforms, transform))


def remote_ref(ref: Any, device_id: Any,
               device_id_type: DeviceIdType = DeviceIdType.MESH) -> Any:
    """``ref`` on device ``device_id`` (a GMEM ref of a symmetric allocation): a device
    index, or a mapping of mesh axes to indices (the other axes keep this device's)."""
    device_id = jax.tree_util.tree_map(lambda i: jnp.asarray(i, jnp.int32), device_id)
    return _with(ref, PeerMemRef(device_id, device_id_type))


def multicast_ref(ref: Any, collective_axes: Hashable | tuple[Hashable, ...]) -> Any:
    """``ref`` on every device along ``collective_axes`` (writes go to all of them)."""
    axes = collective_axes if isinstance(collective_axes, tuple) else (collective_axes,)
    return _with(ref, _MulticastRef(axes))


def cluster_ref(ref: Any, block_id: dict) -> Any:
    """``ref`` (SMEM) of the block of this cluster at ``block_id`` ({axis: index})."""
    axes = tuple(block_id)
    return _with(ref, _ClusterRef(axes, tuple(jnp.asarray(block_id[a], jnp.int32)
                                              for a in axes)))


@dataclasses.dataclass(frozen=True)
class SemaphoreSignal:
    """One signal of ``semaphore_signal_parallel``: ``inc`` on ``ref`` (at
    ``device_id``)."""

    ref: Any
    _: dataclasses.KW_ONLY
    device_id: Any
    inc: int | jax.Array = 1


def semaphore_signal_parallel(*signals: SemaphoreSignal) -> None:
    """Signals several semaphores (the hardware may issue them together)."""
    for s in signals:
        pl.semaphore_signal(s.ref, s.inc, device_id=s.device_id)


def TryClusterCancelResult(num_buffers: int | None = None):  # noqa: N802 - upstream name
    """An SMEM buffer for ``try_cluster_cancel``'s 16-byte result (``num_buffers`` of
    them, if given)."""
    if num_buffers is None:
        return SMEM((16,), jnp.int8)
    return SMEM((num_buffers, 16), jnp.int8)


def try_cluster_cancel(result_ref: Any, barrier: Any) -> None:
    """Asks to take over a not-yet-launched cluster; the answer lands in ``result_ref``
    and ``barrier`` completes when it has. (Interpreters: the request always fails.)"""
    check_barrier(barrier, "try_cluster_cancel")
    result_ref[...] = jnp.zeros(result_ref.shape, result_ref.dtype)
    barrier_arrive(barrier)


def query_cluster_cancel(result_ref: Any, grid_names: Sequence[Hashable]
                         ) -> tuple[tuple[jax.Array, ...], jax.Array]:
    """Decodes ``try_cluster_cancel``'s result: (the cancelled cluster's grid indices,
    whether the cancellation succeeded)."""
    raw = result_ref[...]
    ok = jnp.any(raw != 0)
    return tuple(jnp.int32(0) for _ in grid_names), ok


@jax.tree_util.register_pytree_node_class
class RefUnion:
    """Buffers that may share one allocation (used one after another); the kernel gets
    the same pytree of refs, a union it unpacks (``a, [b, c] = union``) or indexes
    (``union[1]``) into its members. The union itself is no ref: assigning to it is an
    error. The interpreters and the lowering give each member its own buffer."""

    def __init__(self, *refs: Any):
        if not refs:
            raise ValueError("plgpu.RefUnion needs at least one buffer type")
        self.refs = refs

    def __len__(self) -> int:
        return len(self.refs)

    def __iter__(self):
        return iter(self.refs)

    def __getitem__(self, i):
        if not isinstance(i, int):
            raise ValueError(f"a plgpu.RefUnion is indexed by a member's position, not "
                             f"{i!r}: unpack it into its members and read one of them")
        return self.refs[i]

    def __setitem__(self, i, value):
        raise ValueError("a plgpu.RefUnion can't be assigned to: unpack it into its "
                         "members and assign to one of them")

    def tree_flatten(self):
        return self.refs, None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def as_torch_kernel(fn):
    """Wraps a Mosaic GPU kernel for PyTorch tensors (needs a GPU and PyTorch)."""
    raise NotImplementedError("plgpu.as_torch_kernel needs a CUDA GPU and PyTorch; "
                              "pallas-mosaic-gpu does not provide it yet")


def format_tcgen05_sparse_metadata(meta, operand_dtype):
    """Rearranges 2:4 sparsity metadata into the layout ``tcgen05_mma`` reads."""
    raise NotImplementedError("plgpu.format_tcgen05_sparse_metadata: sparse tcgen05_mma is "
                              "not supported by pallas-mosaic-gpu yet")
