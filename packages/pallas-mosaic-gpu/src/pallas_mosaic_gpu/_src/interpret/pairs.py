"""Clusters in GPU interpret mode: a block's view of its cluster peers' memory.

Every block of a cluster has its own copy of each scratch allocation (SMEM, TMEM,
barriers). CTA-pair operations reach the copy of the same allocation in another block
of the pair: a partitioned TMA copy arrives on the leader's barrier, a 2-CTA
``tcgen05_mma`` reads both blocks' operands and writes both blocks' accumulators, a
collective commit arrives on the barrier at the same offset in both blocks. As on the
hardware, the collective tensor-core operations are issued by the leader (the block at
index 0 along the pair's axis); the follower's issue does nothing (upstream's lowering
predicates them on the leader). Accesses of a peer's copy are logged against that copy,
so the race detector checks them like any access of another block's memory.
"""

from __future__ import annotations

from pallas_mosaic_gpu._src.interpret.memory import Buffer


def rank(th, axis: str, what: str) -> tuple[int, int]:
    """(this block's index along the cluster axis ``axis``, the axis' size)."""
    launch = th.launch
    if axis not in launch.cluster_axes:
        raise ValueError(f"{what}: {axis!r} is not a cluster axis of the kernel (cluster "
                         f"axes {list(launch.cluster_axes)})")
    return th.coords[axis], dict(zip(launch.axis_names, launch.sizes))[axis]


def check_pair(th, axis: str, what: str) -> int:
    """Upstream's rule for 2-CTA tensor-core operations: ``axis`` is the first (minormost)
    cluster axis and has exactly 2 blocks. Returns this block's index in the pair."""
    index, size = rank(th, axis, what)
    first = th.launch.cluster_axes[0]
    if axis != first:
        raise ValueError(f"{what}: Can only perform collective MMA along minormost cluster "
                         f"axis. Got {axis}, expected {first}.")
    if size != 2:
        raise ValueError(f"{what}: the cluster axis {axis!r} has {size} blocks; a CTA pair "
                         "needs exactly 2")
    return index


def peer_buffer(th, buf: Buffer, axis: str, index: int) -> Buffer:
    """The copy of ``buf`` held by the block of ``th``'s cluster at ``index`` along
    ``axis`` (the same buffer when ``buf`` is not per block, e.g. GMEM). Made now if
    that block has not reached its allocation yet (every block of a cluster allocates
    alike; its threads then find it)."""
    if th.coords.get(axis) == index:
        return buf
    launch = th.launch
    sym = buf.sym
    if not (isinstance(sym, tuple) and len(sym) == 3):
        return buf  # a kernel operand or global buffer: one for the whole launch
    site, count, where = sym
    if buf.group is not None and where == buf.group:  # a collective allocation
        if axis not in dict(buf.group):
            return buf  # shared along the cluster axis already
        group = tuple((n, index if n == axis else v) for n, v in buf.group)
        key = (site, count, group)
        peer = launch.shared.get(key)
        if peer is None:
            peer = launch.new_buffer(buf.memref, buf.name, group=group)
            launch.shared[key] = launch.register(peer, key)
        return peer
    if buf.group is None and isinstance(where, tuple) and len(where) == len(
            launch.axis_names):  # a per-thread allocation
        pos = launch.axis_names.index(axis)
        key = (site, count, (*where[:pos], index, *where[pos + 1:]))
        peer = launch.symmetric.get(key)
        if peer is None:
            peer = launch.register(launch.new_buffer(buf.memref, buf.name), key)
        return peer
    raise NotImplementedError(
        f"GPU interpret mode (pallas-mosaic-gpu): cannot find the copy of {buf.name} in "
        f"the cluster's block {axis}={index}")


def peer_view(th, view, axis: str, index: int):
    """``(buffer, flat, tree)`` of a ref view, on the block at ``index`` along ``axis``."""
    buf, flat, tree = view
    return peer_buffer(th, buf, axis, index), flat, tree
