"""Symbolic dimensions (``jax.export`` shape polymorphism) in Mosaic TPU modules.

Mosaic's vector types cannot have dynamic sizes, so under
``pl.pallas_export_experimental(dynamic_shapes=True)`` every symbolic dimension the
kernel meets (block shapes, ref slices, vector shapes, ``x.shape[0]`` used as a value)
is written as a *placeholder*: a distinct integer counting down from ``2**31 - 1``. The
module then tells the TPU runtime how to specialise each placeholder once the operands'
shapes are known, with two attributes per placeholder (the convention upstream's Mosaic
lowering uses):

- ``tpu.dynamic_dimension_mapping_module_<p>``: a StableHLO module computing the
  placeholder's dimension expression from the dimension variables, in sorted order;
- ``tpu.dynamic_dimension_mapping_indices_<p>``: for each of those variables, where the
  custom call's operands carry it (``operand_index``, ``dimension_index``; ``-1`` when
  the operand is a dynamic grid size equal to the variable).
"""

from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp
from jaxlib.mlir import ir

from pallas_tpu._src import jax_compat as jc

_FIRST = 2**31 - 1  # placeholders count down from int32 max
_LIMIT = 128  # at most this many distinct symbolic dimensions per kernel


class Placeholders:
    """The placeholder of each symbolic dimension met while building one module."""

    def __init__(self) -> None:
        self.of: dict = {}  # dimension expression -> placeholder

    def __call__(self, d) -> int:
        if d not in self.of:
            if len(self.of) >= _LIMIT:
                raise ValueError(
                    f"the kernel has more than {_LIMIT} distinct symbolic dimensions; "
                    f"Mosaic TPU's dynamic-shape export supports at most {_LIMIT}")
            self.of[d] = _FIRST - len(self.of)
        return self.of[d]


_active: contextvars.ContextVar = contextvars.ContextVar("pallas_tpu_placeholders",
                                                         default=None)


@contextlib.contextmanager
def placeholders(enabled: bool):
    """Symbolic dimensions get placeholders while building a module (if ``enabled``)."""
    token = _active.set(Placeholders() if enabled else None)
    try:
        yield _active.get()
    finally:
        _active.reset(token)


def static_dim(d) -> int:
    """``d`` as a Mosaic size: itself if constant, else its placeholder."""
    if not jc.core.is_symbolic_dim(d):
        return int(d)
    env = _active.get()
    if env is None:
        raise NotImplementedError(
            f"the symbolic dimension {d} (jax.export shape polymorphism) reaches the "
            f"Mosaic TPU kernel; export it under "
            f"pl.pallas_export_experimental(dynamic_shapes=True), or give it a static size")
    return env(d)


def static_shape(shape) -> list[int]:
    return [static_dim(d) for d in shape]


def _locations(dim_vars, operand_avals, grid_bound_dims) -> dict:
    """Where each dimension variable is found among the custom call's operands: the
    first operand dimension equal to it, else a dynamic grid size operand equal to it
    (``dimension_index`` -1; those operands come first)."""
    where: dict[str, tuple[int, int]] = {}
    for i, aval in enumerate(operand_avals):
        for j, d in enumerate(getattr(aval, "shape", ())):
            if jc.core.is_symbolic_dim(d):
                where.setdefault(str(d), (i, j))
    for k, d in enumerate(grid_bound_dims):
        if d is not None:
            where.setdefault(str(d), (k, -1))
    missing = [v for v in dim_vars if v not in where]
    if missing:
        raise ValueError(
            f"dynamic-shape export: the dimension variables {missing} are neither the size "
            f"of a dimension of the pallas_call's operands nor a grid size, so the TPU "
            f"runtime could not specialise the kernel; pass an operand with a dimension "
            f"equal to each of them")
    return where


def _expression_module(expr, dim_vars) -> str:
    """StableHLO computing ``expr`` from the int32 values of ``dim_vars``."""
    def evaluate(*values):
        return jc.core.evaluate_shape((expr,), tuple(dim_vars), *values)[0]

    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    exported = jax.export.export(jax.jit(evaluate), platforms=["cpu"])(
        *[scalar] * len(dim_vars))
    return exported.mlir_module()


def annotate(module: ir.Module, env: Placeholders | None, operand_avals,
             grid_bound_dims=()) -> None:
    """Attaches the specialisation attributes of every placeholder to ``module`` (call
    inside the module's MLIR context). ``operand_avals`` are the custom call's operands'
    (dynamic grid sizes first), ``grid_bound_dims`` the symbolic dimension of each
    dynamic grid size (``None`` for a traced one)."""
    if env is None or not env.of:
        return
    shaped = [a for a in operand_avals if hasattr(a, "shape")]
    shaped += [jc.ShapedArray((d,), jnp.int32) for d in grid_bound_dims if d is not None]
    dim_vars = jc.all_dim_vars(shaped)
    where = _locations(dim_vars, operand_avals, grid_bound_dims)
    i64 = ir.IntegerType.get_signless(64)
    for expr, p in env.of.items():
        module.operation.attributes[f"tpu.dynamic_dimension_mapping_module_{p}"] = (
            ir.StringAttr.get(_expression_module(expr, dim_vars)))
        locs = []
        for v in dim_vars:
            op, dim = where[v]
            locs.append(ir.DictAttr.get({"operand_index": ir.IntegerAttr.get(i64, op),
                                         "dimension_index": ir.IntegerAttr.get(i64, dim)}))
        module.operation.attributes[f"tpu.dynamic_dimension_mapping_indices_{p}"] = (
            ir.ArrayAttr.get(locs))
