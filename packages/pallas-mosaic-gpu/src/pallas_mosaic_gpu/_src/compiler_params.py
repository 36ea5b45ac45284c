"""``plgpu.CompilerParams``: the options of the Mosaic GPU backend (upstream's fields)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import ClassVar, Literal

from pallas import CompilerParams as CoreCompilerParams

DimensionSemantics = Literal["parallel", "sequential"]
_SEMANTICS = ("parallel", "sequential")


class TraceScope(enum.Enum):
    """The granularity at which the profiler records events."""

    WARP = "warp"
    WARPGROUP = "warpgroup"


class LoweringSemantics(enum.Enum):
    """How the kernel's instruction stream is read: per lane, or per warpgroup."""

    Lane = enum.auto()
    Warpgroup = enum.auto()


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompilerParams(CoreCompilerParams):
    """Mosaic GPU compiler parameters; passing an instance selects backend ``mosaic_gpu``.

    ``dimension_semantics``: ``"parallel"`` or ``"sequential"`` per grid dimension;
    ``max_concurrent_steps``: pipeline stages in flight; ``profile_space`` and
    ``profile_dir`` go together (both set, or neither).
    """

    BACKEND: ClassVar[str] = "mosaic_gpu"

    approx_math: bool = False
    dimension_semantics: Sequence[DimensionSemantics] | None = None
    max_concurrent_steps: int = 1
    unsafe_no_auto_barriers: bool = False
    reduction_scratch_bytes: int = 2048
    profile_space: int = 0
    profile_dir: str = ""
    profile_trace_scope: TraceScope = TraceScope.WARPGROUP
    lowering_semantics: LoweringSemantics = LoweringSemantics.Lane

    def __post_init__(self):
        if self.dimension_semantics is not None:
            sems = tuple(self.dimension_semantics)
            bad = [s for s in sems if s not in _SEMANTICS]
            if bad:
                raise ValueError(
                    f"CompilerParams(dimension_semantics=...): {bad[0]!r} is not one of "
                    f"{_SEMANTICS}")
            object.__setattr__(self, "dimension_semantics", sems)
        if self.max_concurrent_steps < 1:
            raise ValueError("CompilerParams(max_concurrent_steps=...) must be >= 1, got "
                             f"{self.max_concurrent_steps}")
        if bool(self.profile_space) ^ bool(self.profile_dir):
            raise ValueError(
                "Either both profile_space and profile_dir must be set, or neither.")

    replace = dataclasses.replace
