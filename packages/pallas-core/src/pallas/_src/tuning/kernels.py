"""What a config's traced function holds: its ``pallas_call``s, their tiling and their size.

Everything here reads the jaxpr only (no compiler): the blocks that do not tile their
arrays, the bytes a grid step keeps on chip, the flops and the op mix of the kernel body.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.extend.core as jex
import numpy as np

from pallas.__about__ import __version__
from pallas._src import block_spec as bs
from pallas._src.registry import registry

# Primitives counted as transcendentals in the op mix (the rest of the arithmetic is "vector").
_TRANSCENDENTAL = frozenset({
    "exp", "exp2", "log", "log1p", "tanh", "logistic", "sin", "cos", "tan", "rsqrt",
    "sqrt", "pow", "erf", "erf_inv", "atan2", "expm1",
})
_MEMORY = frozenset({"get", "swap", "load", "addupdate", "masked_load", "masked_swap"})


def backend_of(params: dict, platform: str) -> Any | None:
    """The backend that lowers this ``pallas_call`` on ``platform`` (``None``: the core
    interpreter, for ``interpret=...``)."""
    if params.get("interpret"):
        return None
    return registry.select_backend(platform, params.get("backend"),
                                   params.get("compiler_params"))


def backend_label(eqns: list, platform: str) -> str:
    """``"name version"`` of each distinct backend the calls use, sorted."""
    names = set()
    for eqn in eqns:
        b = backend_of(eqn.params, platform)
        names.add(f"interpret (pallas-core {__version__})" if b is None
                  else f"{b.name} {b.version}")
    return ", ".join(sorted(names)) or "no pallas_call"


def _dims(bm: Any) -> list[tuple[int, int, Any]]:
    return [(int(a), d.block_size, d) for a, d in zip(bm.array_aval.shape, bm.block_dims)
            if isinstance(a, int | np.integer)]


def untiled_blocks(eqn: Any) -> list[str]:
    """A sentence for the first operand whose ``Blocked`` dims do not divide its array
    (and how many more there are)."""
    gm = eqn.params["grid_mapping"]
    name = eqn.params.get("name") or "kernel"
    out = []
    for bm in gm.block_mappings:
        if bm.whole:
            continue
        bad = [i for i, (a, b, d) in enumerate(_dims(bm))
               if isinstance(d, bs.Blocked) and b and a % b]
        if bad:
            out.append(f"pallas_call {name}: block {tuple(bm.block_shape)} of {bm.origin} "
                       f"does not tile its array {tuple(bm.array_aval.shape)} "
                       f"(dims {bad} leave a partial block)")
    if len(out) > 1:
        return [f"{out[0]}; and {len(out) - 1} more operand(s)"]
    return out


def _itemsize(dtype: Any) -> int:
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 4


def _buffers(bm: Any) -> int:
    mode = bm.pipeline_mode
    count = getattr(mode, "buffer_count", None)
    return int(count) if count else 2  # double-buffered, the pipelines' default


def _scratch_bytes(t: Any) -> int:
    if hasattr(t, "get_memory_ref"):
        t = t.get_memory_ref()
    shape, dtype = getattr(t, "shape", None), getattr(t, "dtype", None)
    if shape is None or dtype is None:
        return 0
    return math.prod(shape) * _itemsize(dtype)


@dataclasses.dataclass(frozen=True)
class KernelFigures:
    """What one ``pallas_call`` costs, read from its jaxpr.

    Attributes:
      name: the kernel's name.
      grid_steps: program instances (the grid's product).
      block_bytes: bytes of one step's blocks, once each.
      footprint_bytes: on-chip bytes a step needs: each pipelined block times its buffer
        count (2 unless ``pipeline_mode=pl.Buffered(n)``), plus scratch.
      hbm_bytes: bytes moved between memory and the chip, all steps (each block once
        per step: an upper bound where consecutive steps reuse a block).
      tile_padded_bytes: ``block_bytes`` with each block's last two dims rounded up to
        (8, 128), the tile a TPU vector register holds (what a narrow block wastes).
      flops: arithmetic of all steps (``dot_general`` as 2*M*N*K, other ops one per element).
      transcendentals: exp/log/tanh/... elements, all steps.
      op_mix: primitive name -> count of equations in the body (loops unrolled by trip count).
    """

    name: str
    grid_steps: int
    block_bytes: int
    footprint_bytes: int
    hbm_bytes: int
    tile_padded_bytes: int
    flops: int
    transcendentals: int
    op_mix: dict


def _size(aval: Any) -> int:
    shape = getattr(aval, "shape", ())
    try:
        return math.prod(int(s) for s in shape)
    except TypeError:
        return 1


def _count(jaxpr: Any, mult: int, acc: dict) -> None:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        acc["mix"][name] = acc["mix"].get(name, 0) + mult
        subs = list(jex.jaxprs_in_params(eqn.params))
        if subs:
            trips = int(eqn.params.get("length", 1) or 1) if name == "scan" else 1
            for sub in subs:
                _count(getattr(sub, "jaxpr", sub), mult * trips, acc)
            continue
        out = sum(_size(v.aval) for v in eqn.outvars)
        if name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            k = math.prod(int(lhs[i]) for i in contract) if contract else 1
            acc["flops"] += 2 * out * k * mult
        elif name in _TRANSCENDENTAL:
            acc["trans"] += out * mult
            acc["flops"] += out * mult
        elif name not in _MEMORY and eqn.outvars:
            acc["flops"] += out * mult


def _lane_padded(shape: tuple) -> int:
    dims = [int(s) for s in shape] or [1]
    dims[-1] = -(-dims[-1] // 128) * 128
    if len(dims) > 1:
        dims[-2] = -(-dims[-2] // 8) * 8
    return math.prod(dims)


def kernel_figures(eqn: Any) -> KernelFigures:
    """:class:`KernelFigures` of one ``pallas_call_p`` equation."""
    p = eqn.params
    gm = p["grid_mapping"]
    steps = math.prod(int(g) if isinstance(g, int | np.integer) else 1 for g in gm.grid)
    block = footprint = padded = 0
    for bm in gm.block_mappings:
        shape = bm.array_aval.shape if bm.whole else bm.block_shape
        nbytes = math.prod(int(s) for s in shape) * _itemsize(bm.array_aval.dtype)
        padded += _lane_padded(shape) * _itemsize(bm.array_aval.dtype)
        block += nbytes
        footprint += nbytes * (1 if bm.whole or steps == 1 else _buffers(bm))
    footprint += sum(_scratch_bytes(t) for t in gm.scratch_types)
    acc: dict = {"mix": {}, "flops": 0, "trans": 0}
    _count(p["jaxpr"].jaxpr, 1, acc)
    return KernelFigures(
        name=p.get("name") or "kernel", grid_steps=steps, block_bytes=block,
        footprint_bytes=footprint, hbm_bytes=block * steps, tile_padded_bytes=padded,
        flops=acc["flops"] * steps,
        transcendentals=acc["trans"] * steps, op_mix=dict(sorted(acc["mix"].items())))
