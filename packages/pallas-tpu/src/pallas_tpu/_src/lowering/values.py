"""The values of the Mosaic TPU lowering: :class:`Lit` (a literal, materialised by the
rule that uses it), :class:`RefVal` (a ref: a memref plus which of its dims the kernel
does not see) and :class:`LoweringContext` (per-function state). The bottom layer of
``lowering/``: values -> emission helpers (``common``, ``windows``, ``emit_math``) ->
the engine owning the rule table (``engine``) -> rule modules (``rules_*``, which import
only downward and never each other) -> ``rules`` (all of them registered) -> ``kernel``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxlib.mlir import ir

from pallas.plugins import RuleTable


@dataclasses.dataclass(frozen=True)
class Lit:
    """A literal (static) value and its aval."""

    val: Any
    aval: Any


@dataclasses.dataclass
class RefVal:
    """A ref in the kernel: a memref, plus its squeezed (kernel-invisible) dims."""

    memref: ir.Value
    dtype: Any
    space: Any
    squeezed: tuple  # one bool per memref dim

    @property
    def memref_shape(self) -> tuple[int, ...]:
        return tuple(ir.MemRefType(self.memref.type).shape)

    @property
    def kernel_shape(self) -> tuple[int, ...]:
        return tuple(n for n, s in zip(self.memref_shape, self.squeezed) if not s)


@dataclasses.dataclass
class LoweringContext:
    """Per-function state: grid sizes and the current program ids."""

    grid: tuple[int, ...]
    grid_indices: list  # i32 ir.Values (empty inside transform functions)
    name: str
    uses: set = dataclasses.field(default_factory=set)  # primitive names lowered
    used_vars: set = dataclasses.field(default_factory=set)
    # ((axis name, size), ...) of the enclosing shard_map mesh, major to minor
    mesh_axes: tuple = ()
    grid_names: tuple = ()  # names of the grid axes (pl.kernel over a mesh)
    # The rule table (primitive -> rule); None means pallas-tpu's own. Another backend
    # building on this engine (pallas-tpu-sparsecore) passes its table, which nested
    # lowerings (loops, conds, run_scoped) inherit because they reuse this context.
    rules: RuleTable | None = None
    backend: str = "mosaic_tpu"  # named in "cannot lower" errors
    # The chip lowered for (``pallas_tpu.compile`` names: "v5e", "v6e", ...), for rules
    # whose support differs per chip; None when no chip is known (they then accept only
    # what every chip compiles).
    chip: str | None = None
    # The jax.named_scope names open at the insertion point (tpu.trace_start emitted).
    scopes: tuple = ()
    # CompilerParams.fuse_transposed_lhs_in_matmul: matmuls contracting the lhs's
    # second-minor axis ask Mosaic to fuse that transpose (tpu.matmul's hint).
    fuse_transposed_lhs: bool = False

    def is_used(self, var) -> bool:
        """Whether a jaxpr variable is read later (e.g. the old value of a swap)."""
        return var in self.used_vars
