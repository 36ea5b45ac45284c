"""Walks a kernel jaxpr and emits Mosaic TPU MLIR through the per-primitive rules.

Values in the environment are ``ir.Value`` (vectors for arrays of rank >= 1, scalars for
rank 0), :class:`RefVal` for refs (a memref plus which of its dims the kernel does not
see), or :class:`Lit` for literals (materialised by the rule that uses them).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mosaic.python import tpu

from pallas.plugins import RuleTable
from pallas_tpu._src import jax_compat as jc
from pallas_tpu._src.enums import LoweringException


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


def lower_jaxpr(lctx: LoweringContext, jaxpr, consts, args) -> list:
    """Emits ``jaxpr`` at the current insertion point; returns its outputs."""
    from pallas_tpu._src.lowering.rules import RULES

    table = RULES if lctx.rules is None else lctx.rules
    env: dict[Any, Any] = {}

    def read(v):
        if isinstance(v, jc.Literal):
            return Lit(v.val, v.aval)
        return env[v]

    for v, c in zip(jaxpr.constvars, consts):
        env[v] = c if isinstance(c, (ir.Value, RefVal, Lit)) else Lit(np.asarray(c), v.aval)
    for v, a in zip(jaxpr.invars, args):
        env[v] = a
    for eqn in jaxpr.eqns:
        lctx.used_vars.update(v for v in eqn.invars if isinstance(v, jc.Var))
    lctx.used_vars.update(v for v in jaxpr.outvars if isinstance(v, jc.Var))
    entry = lctx.scopes
    for eqn in jaxpr.eqns:
        _enter_scopes(lctx, entry, _scopes_of(eqn, entry))
        rule = table.get(eqn.primitive)
        if rule is None:
            reason = table.unsupported_reason(eqn.primitive)
            raise LoweringException(
                f"backend '{lctx.backend}' cannot lower the primitive "
                f"'{eqn.primitive.name}' to Mosaic TPU yet (kernel {lctx.name}, at "
                f"{jc.source_info_summary(eqn)}"
                f"{'; ' + reason if reason else ''}). It runs under interpret=True."
            )
        invals = [read(v) for v in eqn.invars]
        try:
            outs = rule(lctx, eqn, *invals)
        except LoweringException:
            raise
        except (NotImplementedError, ValueError, TypeError) as e:
            raise LoweringException(
                f"Lowering '{eqn.primitive.name}' in kernel {lctx.name} to Mosaic TPU failed "
                f"at {jc.source_info_summary(eqn)}: {type(e).__name__}: {e}"
            ) from e
        lctx.uses.add(eqn.primitive.name)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        for v, o in zip(eqn.outvars, outs):
            env[v] = o
    _enter_scopes(lctx, entry, entry)
    return [read(v) for v in jaxpr.outvars]


def _scopes_of(eqn, entry: tuple) -> tuple:
    """The ``jax.named_scope`` names ``eqn`` was traced in, counted from the kernel's top
    (a nested jaxpr's equations may carry them relative to their parent's)."""
    names = tuple(s.name for s in eqn.source_info.name_stack.stack
                  if type(s).__name__ == "Scope")
    return names if names[:len(entry)] == entry else entry + names


def _enter_scopes(lctx: LoweringContext, entry: tuple, want: tuple) -> None:
    """Closes (``tpu.trace_stop``) the open scopes ``want`` leaves and opens
    (``tpu.trace_start``, level 10) its new ones, as upstream traces named scopes; never
    below ``entry``, the scopes open where this jaxpr's region starts."""
    cur = lctx.scopes
    keep = len(entry)
    while keep < min(len(cur), len(want)) and cur[keep] == want[keep]:
        keep += 1
    for _ in range(len(cur) - keep):
        tpu.trace_stop()
    for name in want[keep:]:
        tpu.trace_start(name, 10)
    lctx.scopes = want
