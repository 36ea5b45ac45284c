"""Small TPU enums of the public surface: ``CoreType``, ``Tiling``, ``BufferType``, and
the base of those that print as their value."""

from __future__ import annotations

import enum

from pallas.plugins import LevelUnsupportedError


class ValueStrEnum(enum.Enum):
    """An enum whose members print as their value (``str(pltpu.PARALLEL) == "parallel"``,
    ``str(pltpu.VMEM) == "vmem"``), as upstream's TPU enums do."""

    def __str__(self) -> str:
        return self.value


class CoreType(enum.Enum):
    """The kinds of TPU cores a kernel or mesh can target."""

    TC = "tc"
    SC_SCALAR_SUBCORE = "sc_scalar_subcore"
    SC_VECTOR_SUBCORE = "sc_vector_subcore"


class Tiling(enum.Enum):
    """Memory tilings that ``emit_pipeline`` can assume for HBM operands."""

    COMPACT = "compact"
    SPARSE_CORE = "sparse_core"


class BufferType(enum.Enum):
    """What a pipelined buffer is for (``emit_pipeline``)."""

    INPUT = 1
    OUTPUT = 2
    ACCUMULATOR = 3
    INPUT_OUTPUT = 4
    MANUAL = 5


class LoweringException(Exception):  # noqa: N818 - upstream name
    """A kernel could not be lowered to Mosaic TPU; the message says which operation."""


class MosaicUnsupported(LoweringException, LevelUnsupportedError):  # noqa: N818
    """A kernel uses a form Mosaic's compiler does not implement on a TPU (it would
    reject it at compile time): refused when lowering, with what would be valid. The
    conformance suite reports it ``unsupported``, not failed."""
