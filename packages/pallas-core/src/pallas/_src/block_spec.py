"""BlockSpecs: how each operand is tiled into the blocks one program instance sees.

A block dimension is one of ``Blocked(n)`` (the index map returns a block index),
``Element(n, padding)`` (it returns an element offset into the padded array),
``Squeezed()`` (a size-1 dimension dropped from the kernel's ref; the index map returns
an element index) or ``BoundedSlice(n)`` (it returns ``pl.ds(start, size)`` with
``size <= n``). A plain int means ``Blocked`` and ``None`` means ``Squeezed``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any

from pallas._src.jax_compat import is_symbolic_dim


@dataclasses.dataclass(frozen=True)
class _SizedDim:
    """A block dimension given by its size alone, shown as ``Kind(size)``."""

    block_size: int

    def __str__(self) -> str:
        return f"{type(self).__name__}({self.block_size})"


@dataclasses.dataclass(frozen=True)
class Blocked(_SizedDim):
    """A dimension tiled in blocks of ``block_size``; the index map returns block indices."""


@dataclasses.dataclass(frozen=True)
class Element:
    """A dimension sliced by element offset; ``padding`` pads the array on both sides."""

    block_size: int
    padding: tuple[int, int] = (0, 0)

    def __str__(self) -> str:
        return f"Element({self.block_size}, padding={self.padding})"


@dataclasses.dataclass(frozen=True)
class Squeezed:
    """A size-1 dimension that the kernel's ref does not have."""

    @property
    def block_size(self) -> int:
        return 1

    def __str__(self) -> str:
        return "Squeezed()"


squeezed = Squeezed()


@dataclasses.dataclass(frozen=True)
class BoundedSlice(_SizedDim):
    """A dimension whose index map returns ``pl.ds(start, size)`` with ``size <= block_size``."""


@dataclasses.dataclass(frozen=True)
class Indirect:
    """A dimension indexed indirectly through an index array (gather-style)."""

    block_size: int


BlockDim = Blocked | Element | Squeezed | BoundedSlice | Indirect


class RevisitMode(enum.Enum):
    """What a pipeline does when a block index repeats (for ``Buffered`` pipelines)."""

    ANY = "any"
    CONSECUTIVE = "consecutive"


@dataclasses.dataclass(frozen=True)
class Buffered:
    """A pipelining hint: how many buffers a backend keeps for an operand."""

    buffer_count: int
    use_lookahead: bool = False
    revisit: RevisitMode | None = None

    def __post_init__(self):
        if self.buffer_count < 1:
            raise ValueError(f"Buffered(buffer_count={self.buffer_count}) must be >= 1")


class NoBlockSpec:
    """The absence of a BlockSpec: the operand is passed whole."""

    def __repr__(self) -> str:
        return "no_block_spec"


no_block_spec = NoBlockSpec()


@dataclasses.dataclass(frozen=True)
class BlockSpec:
    """The block shape, the index map and the memory space of one operand."""

    block_shape: Sequence[BlockDim | int | None] | None = None
    index_map: Callable[..., Any] | None = None
    pipeline_mode: Buffered | None = None
    _: dataclasses.KW_ONLY
    memory_space: Any | None = None

    def replace(self, **changes: Any) -> BlockSpec:
        """A copy with ``changes`` (upstream's ``BlockSpec.replace``)."""
        return dataclasses.replace(self, **changes)

    def __post_init__(self):
        if self.block_shape is not None and not isinstance(self.block_shape, Sequence):
            raise TypeError(
                f"BlockSpec block_shape must be a sequence of block dims, got {self.block_shape!r}"
            )


def canonicalize_block_dim(dim: Any) -> BlockDim:
    """Turns ``None``/int/BlockDim into a BlockDim instance."""
    if dim is None:
        return squeezed
    if isinstance(dim, (Blocked, Element, Squeezed, BoundedSlice, Indirect)):
        return dim
    if hasattr(dim, "__index__"):
        return Blocked(int(dim))
    if is_symbolic_dim(dim):  # jax.export shape polymorphism (dynamic-shape export)
        return Blocked(dim)
    raise TypeError(
        f"a block dimension must be an int, None, pl.Blocked, pl.Element, pl.Squeezed or "
        f"pl.BoundedSlice; got {dim!r} of type {type(dim).__name__}"
    )
