"""Which operand dimensions of a ``pallas_call`` may be sharded, and along which grid axis.

A grid axis ``a`` can be split into contiguous ranges, one per device, when its programs
are independent and every operand it touches is tiled by it exactly: the index map sends
``a`` alone to a block index along one array dimension whose blocks tile the array
(``grid[a] * block == dim``). Sharding that dimension over mesh axes is then the same as
splitting the grid axis. Every other dimension must be replicated; the reason is kept so
that a gather can be explained to the user.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pallas._src import block_spec as bs
from pallas._src import jax_compat as jc
from pallas._src.jaxpr_util import contains
from pallas._src.primitives.grid import num_programs_p, program_id_p
from pallas._src.transforms.grid_axes import grid_axis_param_rules


@dataclasses.dataclass(frozen=True)
class PartitionRule:
    """The sharding rule of one ``pallas_call``.

    ``dims[k][d]`` is the grid axis that may shard dimension ``d`` of block operand ``k``
    (inputs then outputs), or ``None``; ``dim_reasons[k][d]`` says why not when ``None``.
    """

    grid: tuple
    origins: tuple[str, ...]
    num_inputs: int
    dims: tuple[tuple[int | None, ...], ...]
    dim_reasons: tuple[tuple[str | None, ...], ...]
    splittable: frozenset[int]
    axis_reasons: Mapping[int, str]
    reads_index: frozenset[int]  # grid axes whose index the kernel reads (program_id, ...)

    @property
    def any_splittable(self) -> bool:
        return bool(self.splittable)


def dimension_semantics(compiler_params) -> tuple | None:
    """The ``dimension_semantics`` of ``compiler_params`` as lower-case strings, if any."""
    sem = getattr(compiler_params, "dimension_semantics", None)
    if sem is None and isinstance(compiler_params, Mapping):
        for params in compiler_params.values():
            if isinstance(params, Mapping) and params.get("dimension_semantics") is not None:
                sem = params["dimension_semantics"]
                break
    if sem is None:
        return None
    return tuple(str(getattr(s, "value", s)).lower() for s in sem)


def _grid_deps(closed) -> list[frozenset[int]]:
    """For each output of an index-map jaxpr, the grid axes (leading invars) it uses."""
    jaxpr = closed.jaxpr
    deps: dict = {v: frozenset({i}) for i, v in enumerate(jaxpr.invars)}

    def of(atom):
        return frozenset() if isinstance(atom, jc.Literal) else deps.get(atom, frozenset())

    for eqn in jaxpr.eqns:
        d = frozenset().union(*(of(v) for v in eqn.invars))
        for o in eqn.outvars:
            deps[o] = d
    return [of(o) for o in jaxpr.outvars]


def _dim_outputs(bm) -> list[int | None]:
    """The index-map output giving each block dim's block index (``None`` for dims whose
    index is a start offset or a bounded slice)."""
    out, k = [], 0
    for d in bm.block_dims:
        if isinstance(d, bs.BoundedSlice):
            out.append(None)
            k += 2
        else:
            out.append(k if isinstance(d, (bs.Blocked, bs.Squeezed)) else None)
            k += 1
    return out


def _reads(jaxpr, gm) -> tuple[frozenset[int], dict[int, str]]:
    """Grid axes the kernel reads by position (and those read by a backend primitive,
    which cannot be offset)."""
    names = tuple(gm.grid_names or ())
    reads: set[int] = set()
    opaque: dict[int, str] = {}

    def visit(eqn):
        if eqn.primitive in (program_id_p, num_programs_p):
            reads.add(eqn.params["axis"])
        elif eqn.primitive is jc.axis_index_p and names:
            axis_names = eqn.params.get("axis_name")
            for n in axis_names if isinstance(axis_names, tuple) else (axis_names,):
                if n in names:
                    reads.add(names.index(n))
        elif eqn.primitive in grid_axis_param_rules:
            axis = eqn.params.get("axis")
            for a in range(len(gm.grid)) if axis is None else (axis,):
                opaque.setdefault(a, str(eqn.primitive))
        return False

    contains(getattr(jaxpr, "jaxpr", jaxpr), visit)
    return frozenset(reads), opaque


def derive_rule(gm, jaxpr, compiler_params) -> PartitionRule:
    """The partition rule of a call with grid mapping ``gm`` and kernel ``jaxpr``."""
    grid = tuple(gm.grid)
    n_grid = len(grid)
    bms = gm.block_mappings
    sem = dimension_semantics(compiler_params)
    reads, opaque = _reads(jaxpr, gm)

    cand: list[list[int | None]] = []
    reasons: list[list[str | None]] = []
    touches: list[list[frozenset[int]]] = []  # per operand, per index-map output
    for bm in bms:
        shape = bm.array_aval.shape
        deps = [] if bm.whole else _grid_deps(bm.index_map_jaxpr)
        deps = [d & frozenset(range(n_grid)) for d in deps]
        touches.append(deps)
        outs = [None] * len(shape) if bm.whole else _dim_outputs(bm)
        c, r = [], []
        for d, n in enumerate(shape):
            k = outs[d]
            if bm.whole:
                c.append(None)
                r.append("the kernel takes the operand whole (no BlockSpec tiles it)")
                continue
            dim = bm.block_dims[d]
            if k is None:
                c.append(None)
                r.append(f"its block dimension is {dim} (only Blocked or squeezed "
                         f"dimensions follow a grid axis)")
                continue
            var = bm.index_map_jaxpr.jaxpr.outvars[k]
            invars = bm.index_map_jaxpr.jaxpr.invars
            axes = deps[k]
            if not axes:
                c.append(None)
                r.append("no grid axis indexes it (every program reads the same block "
                         "along it)")
            elif var not in invars[:n_grid]:
                names = ", ".join(str(a) for a in sorted(axes))
                c.append(None)
                r.append(f"its block index is computed from grid axes ({names}), not one "
                         f"grid axis alone")
            else:
                a = invars.index(var)
                size = dim.block_size
                if not isinstance(grid[a], int) or jc.is_symbolic_dim(n) or (
                        grid[a] * size != n):
                    c.append(None)
                    r.append(f"blocks of {size} along grid axis {a} (size {grid[a]}) do "
                             f"not tile the dimension of size {n} exactly")
                else:
                    c.append(a)
                    r.append(None)
        cand.append(c)
        reasons.append(r)

    axis_reasons: dict[int, str] = {}
    n_in = gm.num_inputs
    for a in range(n_grid):
        why = None
        if not isinstance(grid[a], int):
            why = "its size is dynamic"
        elif a in opaque:
            why = f"the kernel reads it through {opaque[a]}, which cannot be offset"
        elif sem is not None and a < len(sem) and "parallel" not in sem[a]:
            why = f"its dimension_semantics is {sem[a]!r}"
        if why is None:
            for k, bm in enumerate(bms):
                uses = sum(1 for dep in touches[k] if a in dep)
                tiled = cand[k].count(a)
                if k >= n_in and tiled != 1:
                    why = (f"the block of output {bm.origin} is revisited along it (the "
                           f"kernel may accumulate across it)")
                    break
                if uses and (tiled != 1 or uses != 1):
                    why = (f"the index map of {bm.origin} uses it other than as the block "
                           f"index of one exactly tiled dimension")
                    break
        if why is None and (sem is None or a >= len(sem)):
            if gm.scratch_types:
                why = ("the kernel has scratch buffers, which may carry state across it "
                       "(declare dimension_semantics 'parallel' to split it)")
            elif gm.input_output_aliases:
                why = ("the kernel aliases inputs to outputs (declare dimension_semantics "
                       "'parallel' to split it)")
        if why is not None:
            axis_reasons[a] = why

    splittable = frozenset(a for a in range(n_grid) if a not in axis_reasons)
    dims, dim_reasons = [], []
    for c, r in zip(cand, reasons):
        dims.append(tuple(a if a in splittable else None for a in c))
        dim_reasons.append(tuple(
            rr if a is None else (None if a in splittable
                                  else f"grid axis {a} cannot be split: {axis_reasons[a]}")
            for a, rr in zip(c, r)))
    return PartitionRule(
        grid=grid, origins=tuple(bm.origin for bm in bms), num_inputs=n_in,
        dims=tuple(dims), dim_reasons=tuple(dim_reasons), splittable=splittable,
        axis_reasons=axis_reasons, reads_index=reads)
