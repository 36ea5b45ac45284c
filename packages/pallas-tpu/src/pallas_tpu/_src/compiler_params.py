"""``pltpu.CompilerParams`` and the grid dimension semantics of Mosaic TPU."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from pallas import CompilerParams as CoreCompilerParams
from pallas_tpu._src.enums import CoreType, ValueStrEnum


class GridDimensionSemantics(ValueStrEnum):
    """How Mosaic may run the iterations of one grid dimension.

    ``PARALLEL``: independent iterations (may be split across TensorCores on megacore
    chips); ``ARBITRARY``: sequential (e.g. a reduction axis carrying an accumulator);
    ``CORE_PARALLEL``: split across the cores of the chip explicitly;
    ``SUBCORE_PARALLEL``: split across SparseCore subcores.
    """

    PARALLEL = "parallel"
    ARBITRARY = "arbitrary"
    CORE_PARALLEL = "core_parallel"
    SUBCORE_PARALLEL = "subcore_parallel"


PARALLEL = GridDimensionSemantics.PARALLEL
ARBITRARY = GridDimensionSemantics.ARBITRARY
CORE_PARALLEL = GridDimensionSemantics.CORE_PARALLEL
SUBCORE_PARALLEL = GridDimensionSemantics.SUBCORE_PARALLEL

DimensionSemantics = GridDimensionSemantics | Literal[
    "parallel", "arbitrary", "core_parallel", "subcore_parallel"]


class SideEffectType(enum.Enum):
    """Whether XLA may remove or reorder the kernel (``has_side_effects=``)."""

    PURE = "pure"
    # The kernel has side effects XLA must keep (e.g. writes through aliased refs).
    SIDE_EFFECTING = "side_effecting"
    # Side-effecting, but XLA may still remove it when its outputs are unused.
    DATAFLOW_SIDE_EFFECTING = "dataflow_side_effecting"


# Which TPU core runs the kernel: the kinds of core are listed once, in CoreType.
KernelType = enum.Enum("KernelType", [(c.name, c.value) for c in CoreType],
                       module=__name__)
KernelType.__doc__ = "Which TPU core runs the kernel (the members of ``CoreType``)."


def canonical_semantics(s: Any) -> GridDimensionSemantics:
    if isinstance(s, GridDimensionSemantics):
        return s
    if isinstance(s, str):
        try:
            return GridDimensionSemantics(s.lower())
        except ValueError:
            pass
    raise ValueError(
        f"dimension_semantics entries must be pltpu.PARALLEL, pltpu.ARBITRARY, "
        f"pltpu.CORE_PARALLEL or pltpu.SUBCORE_PARALLEL (or their names); got {s!r}"
    )


@dataclasses.dataclass(frozen=True)
class CompilerParams(CoreCompilerParams):
    """Mosaic TPU options for ``pallas_call``; passing one selects the ``mosaic_tpu`` backend.

    Attributes:
      dimension_semantics: one entry per grid dimension (see
        :class:`GridDimensionSemantics`); default all ``ARBITRARY``.
      allow_input_fusion: per input, whether XLA may fuse its producer into the kernel.
      vmem_limit_bytes: the scoped VMEM limit for the kernel.
      collective_id: the barrier semaphore id for kernels that communicate.
      has_side_effects: ``True``/``SideEffectType``: keep the kernel even if unused.
      flags: Mosaic compiler flags (name -> bool/int/float).
      internal_scratch_in_bytes: Mosaic's internal scratch size.
      serialization_format: the Mosaic serialization format (1).
      kernel_type: which TPU core runs the kernel (TensorCore by default).
      disable_bounds_checks: turn off Mosaic's runtime bounds checks.
      disable_semaphore_checks: turn off Mosaic's runtime semaphore checks.
      skip_device_barrier: skip the device barrier of communicating kernels.
      allow_collective_id_without_custom_barrier: as in JAX's Mosaic packaging.
      shape_invariant_numerics: ask Mosaic for numerics independent of shapes.
      needs_layout_passes: run Mosaic's layout passes (always on for TensorCore).
      fuse_transposed_lhs_in_matmul: hint Mosaic to fuse the transpose of a matmul's
        lhs when the kernel contracts its second-minor axis (``einsum("km,kn->mn")``).
      chip: (pallas-tpu only) the chip ``pallas_tpu.compile`` and the conformance
        ``compile`` level compile the kernel for when they are not given one (``"v4"``,
        ``"v5e"``, ``"v5p"``, ``"v6e"``, ``"7x"``); lowering ignores it.
    """

    BACKEND: ClassVar[str] = "mosaic_tpu"

    dimension_semantics: Sequence[DimensionSemantics] | None = None
    allow_input_fusion: Sequence[bool] | None = None
    vmem_limit_bytes: int | None = None
    collective_id: int | None = None
    has_side_effects: bool | SideEffectType = False
    flags: Mapping[str, Any] | None = None
    internal_scratch_in_bytes: int | None = None
    serialization_format: int = 1
    kernel_type: KernelType = KernelType.TC
    disable_bounds_checks: bool = False
    disable_semaphore_checks: bool = False
    skip_device_barrier: bool = False
    allow_collective_id_without_custom_barrier: bool = False
    shape_invariant_numerics: bool = False
    needs_layout_passes: bool | None = None
    fuse_transposed_lhs_in_matmul: bool = False
    use_tc_tiling_on_sc: bool | None = None
    chip: Any = None

    def __post_init__(self):
        if self.dimension_semantics is not None:
            object.__setattr__(self, "dimension_semantics",
                               tuple(canonical_semantics(s) for s in self.dimension_semantics))
        if self.allow_input_fusion is not None:
            object.__setattr__(self, "allow_input_fusion",
                               tuple(bool(b) for b in self.allow_input_fusion))
        if self.flags is not None:
            object.__setattr__(self, "flags", tuple(sorted(dict(self.flags).items())))
        if self.vmem_limit_bytes is not None and not isinstance(self.vmem_limit_bytes, int):
            raise TypeError(f"vmem_limit_bytes must be an int; got {self.vmem_limit_bytes!r}")
        if not isinstance(self.has_side_effects, (bool, SideEffectType)):
            raise ValueError(
                f"Invalid side effect type: {self.has_side_effects!r} (has_side_effects takes "
                f"a bool or a pltpu.SideEffectType: "
                f"{', '.join(m.name for m in SideEffectType)})")

    @property
    def flags_dict(self) -> dict[str, Any] | None:
        return None if self.flags is None else dict(self.flags)

    def replace(self, **changes) -> CompilerParams:
        if "flags" not in changes and self.flags is not None:
            changes["flags"] = dict(self.flags)
        return dataclasses.replace(self, **changes)
