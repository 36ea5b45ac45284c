"""What the SparseCores of a TPU chip have: cores, subcores per core, lanes per vector.

SparseCore kernels are traced against a *target chip*. On a TPU it is the attached
chip. Elsewhere (a CPU machine lowering ahead of time, or the interpreter) it is, in
order: the chip of an enclosing :func:`target_chip` block, the environment variable
``PALLAS_SPARSECORE_CHIP`` (``v5p``, ``v6e``, ``7``, ``7x`` or ``8i``), else
:data:`DEFAULT_CHIP` (TPU7x). No device is queried off-TPU, so tracing and lowering work on any machine.
``pltpu.CompilerParams`` has no chip field; ``plsc.CompilerParams(chip=...)`` checks
a kernel against a chip at lowering.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

import jax.numpy as jnp

from pallas_tpu import ChipVersion, get_tpu_info, get_tpu_info_for_chip, is_tpu_device
from pallas_tpu.extend import SparseCoreInfo

ENV_VAR = "PALLAS_SPARSECORE_CHIP"


def _sparse_cores() -> dict:
    """Every chip pallas-tpu knows that has SparseCores, with their figures."""
    out = {}
    for chip in ChipVersion:
        sc = get_tpu_info_for_chip(chip, 1).sparse_core
        if sc is not None:
            out[chip] = sc
    return out


# The figures are pallas-tpu's (pltpu.get_tpu_info_for_chip(chip, 1).sparse_core).
_CHIPS: dict[ChipVersion, SparseCoreInfo] = _sparse_cores()

#: The chip SparseCore kernels target when no TPU is attached and none is chosen.
DEFAULT_CHIP = ChipVersion.TPU_7X

_override: list[ChipVersion] = []


def chips() -> tuple[ChipVersion, ...]:
    """The chips with SparseCores that this package knows."""
    return tuple(_CHIPS)


def canonical_chip(chip) -> ChipVersion:
    """``chip`` (a ``pltpu.ChipVersion`` or its name, e.g. ``"v5p"``) as a ChipVersion
    with SparseCores; a ValueError lists the valid ones otherwise."""
    valid = ", ".join(str(c) for c in _CHIPS)
    try:
        c = chip if isinstance(chip, ChipVersion) else ChipVersion(str(chip).lower())
    except ValueError:
        raise ValueError(f"unknown TPU chip {chip!r}; chips with SparseCores: {valid}") from None
    if c not in _CHIPS:
        raise ValueError(f"TPU {c} has no SparseCores; chips with SparseCores: {valid}")
    return c


def get_sparse_core_info_for_chip(chip) -> SparseCoreInfo:
    """The :class:`SparseCoreInfo` of ``chip`` (no device needed)."""
    return _CHIPS[canonical_chip(chip)]


def current_chip() -> ChipVersion:
    """The target chip: the attached TPU, else :func:`target_chip`, the environment
    variable, or :data:`DEFAULT_CHIP` (see the module docstring)."""
    if _override:
        return _override[-1]
    if is_tpu_device():
        chip = get_tpu_info().chip_version
        if chip not in _CHIPS:
            raise RuntimeError(f"The current TPU ({chip}) does not have SparseCores")
        return chip
    env = os.environ.get(ENV_VAR)
    if env:
        try:
            return canonical_chip(env)
        except ValueError as e:
            raise ValueError(f"{ENV_VAR}={env!r}: {e}") from None
    return DEFAULT_CHIP


def chosen_chip() -> ChipVersion | None:
    """The chip chosen by :func:`target_chip` or the environment variable, else None."""
    if _override:
        return _override[-1]
    env = os.environ.get(ENV_VAR)
    return canonical_chip(env) if env else None


def get_sparse_core_info() -> SparseCoreInfo:
    """The SparseCore figures of the target chip (see :func:`current_chip`).

    Upstream queries the attached TPU and fails elsewhere; here a CPU machine gets the
    target chip's figures so that SparseCore kernels trace, lower and interpret.
    """
    return _CHIPS[current_chip()]


@contextlib.contextmanager
def target_chip(chip) -> Iterator[SparseCoreInfo]:
    """Within the block, SparseCore kernels target ``chip`` (meshes' defaults, lane
    checks, lowering)."""
    _override.append(canonical_chip(chip))
    try:
        yield _CHIPS[_override[-1]]
    finally:
        _override.pop()


def supported_shapes(dtype, info: SparseCoreInfo | None = None) -> list[tuple[int, ...]]:
    """The vector shapes one vector-subcore register holds for ``dtype``: ``(lanes,)``
    for 32-bit types; ``(lanes * p,)`` and ``(p, lanes)`` for types packed ``p`` per
    32-bit lane."""
    info = info or get_sparse_core_info()
    itemsize = jnp.dtype(dtype).itemsize
    if itemsize > 4:
        return []
    p = 4 // itemsize
    lanes = info.num_lanes
    return [(lanes,)] if p == 1 else [(lanes * p,), (p, lanes)]


def check_vector_shape(what: str, shape: Sequence[int], dtype,
                       info: SparseCoreInfo | None = None) -> None:
    """Raises a ValueError naming ``what`` unless a vector subcore holds ``shape``."""
    info = info or get_sparse_core_info()
    valid = supported_shapes(dtype, info)
    if tuple(shape) in valid:
        return
    chip = current_chip()
    if not valid:
        raise ValueError(
            f"{what}: {jnp.dtype(dtype).name} vectors are not supported on SparseCore "
            f"(elements of at most 32 bits)")
    raise ValueError(
        f"{what} has shape {tuple(shape)} and dtype {jnp.dtype(dtype).name}, which the "
        f"{info.num_lanes} lanes of a TPU {chip} vector subcore cannot hold; valid "
        f"shapes for {jnp.dtype(dtype).name}: {', '.join(map(str, valid))}"
    )
