"""GridSpecs, and their resolution into a validated ``GridMapping``.

``resolve_grid_mapping`` is where every trace-time check on grids and BlockSpecs lives:
each error names the operand by its pytree path, the block shape and the array shape.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import operator
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas._src import api_errors
from pallas._src import block_spec as bs
from pallas._src import jax_compat as jc
from pallas._src.dynamic_grid import (
    check_symbolic_block,
    dynamic_grid_dim,
    grid_str,
    unzip_dynamic_grid,
)
from pallas._src.memory import MemoryRef, MemorySpace, as_memory_ref, is_buffer_type
from pallas._src.primitives.grid import tracing_grid


@dataclasses.dataclass(frozen=True)
class GridSpec:
    """The grid, the in/out BlockSpecs and the scratch buffers of a ``pallas_call``."""

    grid: Any = ()
    in_specs: Any = bs.no_block_spec
    out_specs: Any = bs.no_block_spec
    scratch_shapes: Any = ()

    # Scalar-prefetch operands: the first ``num_scalar_prefetch`` operands are passed
    # whole (in scalar memory) to the kernel and to every index map.
    num_scalar_prefetch: int = dataclasses.field(default=0, init=False)

    def __post_init__(self):
        grid = self.grid
        if grid is None:
            grid = ()
        elif isinstance(grid, (int, np.integer)) or hasattr(grid, "__index__"):
            grid = (grid,)
        object.__setattr__(self, "grid", tuple(grid))
        if isinstance(self.in_specs, list):
            object.__setattr__(self, "in_specs", tuple(self.in_specs))
        elif self.in_specs is not bs.no_block_spec and not isinstance(self.in_specs, tuple):
            raise ValueError(
                f"`in_specs` must be a tuple or a list. Found: {self.in_specs} (one spec per "
                f"operand of the kernel, e.g. in_specs=[spec])"
            )
        if isinstance(self.out_specs, list):
            object.__setattr__(self, "out_specs", tuple(self.out_specs))
        if isinstance(self.scratch_shapes, list):
            object.__setattr__(self, "scratch_shapes", tuple(self.scratch_shapes))


@dataclasses.dataclass(frozen=True)
class PrefetchScalarGridSpec(GridSpec):
    """A GridSpec whose first ``num_scalar_prefetch`` operands feed every index map."""

    num_scalar_prefetch: int = 0

    def __init__(self, num_scalar_prefetch: int, grid=(), in_specs=bs.no_block_spec,
                 out_specs=bs.no_block_spec, scratch_shapes=()):
        object.__setattr__(self, "grid", grid)
        object.__setattr__(self, "in_specs", in_specs)
        object.__setattr__(self, "out_specs", out_specs)
        object.__setattr__(self, "scratch_shapes", scratch_shapes)
        object.__setattr__(self, "num_scalar_prefetch", int(num_scalar_prefetch))
        self.__post_init__()


# --------------------------------------------------------------------------------------
# The resolved form that the primitive carries.


@dataclasses.dataclass(frozen=True, eq=False)
class BlockMapping:
    """How one operand is tiled: its array, block dims, index map and memory space.

    ``index_map_jaxpr`` takes the grid indices (int32 scalars) followed by the
    scalar-prefetch refs, and returns one value per block dim (two — start and size —
    for a ``BoundedSlice`` dim).
    """

    origin: str
    array_aval: Any  # ShapedArray of the whole operand
    block_dims: tuple  # of BlockDim
    index_map_jaxpr: Any  # ClosedJaxpr
    memory_space: Any = None
    pipeline_mode: Any = None
    whole: bool = False  # passed whole: no blocking at all
    index_map_uses_prefetch: bool = False
    # A backend BlockSpec's layout transforms of the block (plgpu.BlockSpec(transforms=
    # (TilingTransform, SwizzleTransform))), for that backend's lowering; () otherwise.
    transforms: tuple = ()

    @property
    def block_shape(self) -> tuple[int, ...]:
        """The block's size in every array dimension (1 for squeezed dims)."""
        return tuple(d.block_size for d in self.block_dims)

    @property
    def ref_shape(self) -> tuple[int, ...]:
        """The shape of the ref the kernel sees (squeezed dims removed)."""
        return tuple(d.block_size for d in self.block_dims if not isinstance(d, bs.Squeezed))

    @property
    def ref_aval(self):
        """The kernel's ref type; a block with no memory space is in ``MemorySpace.DEFAULT``
        (the backend decides), so it prints ``Ref<default>{...}`` as upstream."""
        space = MemorySpace.DEFAULT if self.memory_space is None else self.memory_space
        return jc.AbstractRef(jc.ShapedArray(self.ref_shape, self.array_aval.dtype),
                              memory_space=space)

    @property
    def symbolic(self) -> bool:
        """Whether the array or block has a symbolic dimension (``jax.export``)."""
        return any(map(jc.is_symbolic_dim, (*self.array_aval.shape, *self.block_shape)))

    @property
    def has_partial_blocks(self) -> bool:
        """True when some Blocked dim does not divide its array dim (edge blocks)."""
        return any(
            isinstance(d, bs.Blocked) and n % d.block_size
            for d, n in zip(self.block_dims, self.array_aval.shape)
        )

    def __repr__(self) -> str:
        dims = ", ".join(str(d) for d in self.block_dims)
        return (
            f"BlockMapping({self.origin}: array {self.array_aval.str_short()}, "
            f"block ({dims}), memory_space={self.memory_space})"
        )


@dataclasses.dataclass(frozen=True, eq=False)
class GridMapping:
    """Everything about the grid and operand tiling that the interpreter and backends need.

    Operand order everywhere: scalar-prefetch operands, inputs, outputs; the kernel sees
    refs in that order, followed by scratch refs.
    """

    grid: tuple[int, ...]
    grid_names: tuple | None
    num_scalar_prefetch: int
    prefetch_avals: tuple  # ShapedArrays of the scalar-prefetch operands
    block_mappings: tuple  # BlockMapping for every input then every output
    num_inputs: int
    num_outputs: int
    scratch_types: tuple  # MemoryRef per scratch operand
    scratch_origins: tuple
    input_output_aliases: tuple  # ((input index among all operands, output index), ...)
    mesh: Any = None  # the mesh of pl.kernel (grid = its axes), for backends that need it
    # Per dynamic grid size: its symbolic dimension under jax.export (None when traced),
    # so a backend can tell where a dimension variable comes from.
    grid_bound_dims: tuple = ()

    @property
    def in_block_mappings(self) -> tuple:
        return self.block_mappings[: self.num_inputs]

    @property
    def out_block_mappings(self) -> tuple:
        return self.block_mappings[self.num_inputs :]

    @property
    def num_scratch(self) -> int:
        return len(self.scratch_types)

    @property
    def num_dynamic_grid_bounds(self) -> int:
        """How many grid sizes are dynamic: the first operands of ``pallas_call_p``."""
        return sum(1 for g in self.grid if g is dynamic_grid_dim)

    @property
    def num_grid_points(self) -> int:
        if self.num_dynamic_grid_bounds:
            raise ValueError(f"the grid {self.grid} has dynamic sizes: its number of "
                             f"points is only known at run time")
        return math.prod(self.grid)

    def runtime_grid(self, bounds) -> tuple:
        """The grid with each dynamic size replaced by its value from ``bounds``."""
        it = iter(bounds)
        return tuple(next(it) if g is dynamic_grid_dim else g for g in self.grid)

    def __repr__(self) -> str:
        lines = [f"GridMapping(grid={self.grid}, num_scalar_prefetch={self.num_scalar_prefetch}"]
        lines += [f"  {bm!r}" for bm in self.block_mappings]
        lines += [f"  scratch {o}: {t}" for o, t in zip(self.scratch_origins, self.scratch_types)]
        if self.input_output_aliases:
            lines.append(f"  aliases (input -> output): {self.input_output_aliases}")
        return "\n".join(lines) + ")"


# --------------------------------------------------------------------------------------
# Resolution and validation.


def _shape_str(aval) -> str:
    return f"{tuple(aval.shape)} {jnp.dtype(aval.dtype).name}"


def _check_grid(grid) -> tuple:
    out = []
    for i, g in enumerate(grid):
        if g is dynamic_grid_dim:
            out.append(g)
            continue
        if isinstance(g, jax.core.Tracer) or jc.is_symbolic_dim(g):
            _, (bound,) = unzip_dynamic_grid((g,))  # checks the traced value's type
            raise ValueError(
                f"pallas_call grid[{i}] = {grid_str(bound)} is dynamic but reached grid "
                f"resolution unsplit (an internal error: dynamic sizes are operands)"
            )
        try:
            g = operator.index(g)  # ints, NumPy/JAX integers; never floats or strings
        except TypeError:
            raise TypeError(
                f"pallas_call grid[{i}] must be an int (the number of programs along that "
                f"axis); got {g!r} of type {type(g).__name__} in grid={tuple(grid)!r}. "
                f"Use an integer, e.g. grid=(pl.cdiv(n, block),)."
            ) from None
        if g < 0:
            raise ValueError(f"grid dimension {i} must be >= 0; got grid={tuple(grid)!r}")
        out.append(g)
    return tuple(out)


def _flatten_specs(specs, tree, what: str, operands: str, paths, avals):
    """One spec per operand leaf; ``specs`` must have the operands' pytree structure
    (lists and tuples alike), as upstream."""
    if specs is bs.no_block_spec:
        return [bs.no_block_spec] * tree.num_leaves
    errors = api_errors.tree_mismatches(specs, tree, _is_spec_leaf)
    if errors:
        have = ", ".join(f"{p}: {_shape_str(a)}" for p, a in zip(paths, avals)) or "none"
        raise ValueError(
            api_errors.tree_mismatch_message(what, operands, errors)
            + f"\n(the operands: {have})"
        )
    return api_errors.leaves_up_to(specs, tree, _is_spec_leaf)


def _is_spec_leaf(x) -> bool:
    return x is None or isinstance(x, (bs.BlockSpec, bs.NoBlockSpec))


def _index_map_arity_error(origin, index_map, n_grid, n_prefetch, block_dims,
                           array_aval) -> TypeError:
    """Python's own arity message (as upstream shows it), then what the index map is given."""
    n_expected = n_grid + n_prefetch
    what = f"{n_grid} grid indices" + (
        f" and {n_prefetch} scalar-prefetch refs" if n_prefetch else ""
    )
    try:
        index_map(*range(n_expected))  # raises before running the body: arity is checked first
        python = "its signature does not accept them"
    except TypeError as e:
        python = str(e)
    return TypeError(
        f"{python}. Index map function {api_errors.func_src_info(index_map)} for {origin} "
        f"(block_shape={_dims_str(block_dims)}, array {_shape_str(array_aval)}) is called "
        f"with {n_expected} positional arguments ({what})"
    )


def _dims_str(block_dims) -> str:
    return "(" + ", ".join(str(d) for d in block_dims) + ("," if len(block_dims) == 1 else "") + ")"


def _trace_index_map(origin, spec, block_dims, array_aval, grid, prefetch_avals,
                     prefetch_tree=None):
    """Traces an index map into a jaxpr and checks the indices it returns (one integer
    scalar per block dim) and that it captures no array constants.

    ``prefetch_tree`` (a tuple treedef) groups the flat scalar-prefetch refs into the
    scalar-prefetch arguments as the user passed them (pytrees, ``None``), which is how
    the index map receives them."""
    index_map = spec.index_map
    n_grid, n_prefetch = len(grid), len(prefetch_avals)
    n_pf_args = n_prefetch if prefetch_tree is None else len(prefetch_tree.children())
    if index_map is None:

        def index_map(*args):
            return (0,) * len(block_dims)

    try:
        sig = inspect.signature(index_map)
        sig.bind(*range(n_grid + n_pf_args))
    except TypeError:
        raise _index_map_arity_error(
            origin, index_map, n_grid, n_pf_args, block_dims, array_aval
        ) from None
    except ValueError:  # builtins without signatures
        pass

    idx_avals = [jc.ShapedArray((), jnp.int32)] * n_grid
    pf_avals = [jc.AbstractRef(a, memory_space=None) for a in prefetch_avals]
    where = f"Index map function {api_errors.func_src_info(index_map)} for {origin}"

    def as_index(i, o):
        aval = jax.typeof(o) if not isinstance(o, (int, np.integer)) else None
        if aval is not None and (aval.shape != () or not jnp.issubdtype(aval.dtype, jnp.integer)):
            raise ValueError(
                f"{where} must return integer scalars. Output[{i}] has type {aval} "
                f"(block_shape={_dims_str(block_dims)}, array {_shape_str(array_aval)})."
            )
        return jnp.asarray(o, jnp.int32)

    def flat_index_map(*args):
        if prefetch_tree is not None:
            args = (*args[:n_grid],
                    *jax.tree_util.tree_unflatten(prefetch_tree, args[n_grid:]))
        out = index_map(*args)
        if not isinstance(out, tuple):
            out = (out,)
        if len(out) != len(block_dims):
            raise ValueError(
                f"{where} must return {len(block_dims)} values to match "
                f"block_shape={_dims_str(block_dims)} of array {_shape_str(array_aval)}. "
                f"Currently returning {len(out)} values."
            )
        flat = []
        for i, (o, d) in enumerate(zip(out, block_dims)):
            if isinstance(d, bs.BoundedSlice):
                if not isinstance(o, jc.Slice):
                    raise ValueError(
                        f"{where} must return pl.ds(start, size) for the "
                        f"BoundedSlice dimension {i}; got {o!r}"
                    )
                flat += [as_index(i, o.start), as_index(i, o.size)]
            else:
                if isinstance(o, jc.Slice):
                    raise ValueError(
                        f"{where} returned a slice for dimension {i}, whose "
                        f"block dim is {d}; only BoundedSlice dimensions take pl.ds"
                    )
                flat.append(as_index(i, o))
        return flat

    with tracing_grid(grid):  # pl.num_programs of a static axis is its size
        jaxpr, _, consts = jc.trace_kernel_to_jaxpr(
            flat_index_map, [*idx_avals, *pf_avals], f"index_map for {origin}"
        )
    arrays = [c for c in consts if np.ndim(c) != 0 or isinstance(c, jax.core.Tracer)]
    if arrays:
        shapes = ", ".join(jax.typeof(c).str_short() for c in arrays)
        raise ValueError(
            f"{where} must not capture constants: [{shapes}]. Pass them as scalar-prefetch "
            f"operands (pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=...)) instead."
        )
    uses_prefetch = _depends_on(jaxpr, range(n_grid, n_grid + n_prefetch))
    return jc.ClosedJaxpr(jaxpr, consts), uses_prefetch


def _depends_on(jaxpr, invar_indices) -> bool:
    """Whether any output of ``jaxpr`` depends on the given invars (conservatively)."""
    tainted = {jaxpr.invars[i] for i in invar_indices}
    if not tainted:
        return False
    for eqn in jaxpr.eqns:
        if any(isinstance(v, jc.Var) and v in tainted for v in eqn.invars):
            tainted.update(eqn.outvars)
    return any(isinstance(v, jc.Var) and v in tainted for v in jaxpr.outvars)


def _check_block_dims(origin, block_dims, array_aval, block_shape_in):
    shape = array_aval.shape
    if len(block_dims) != len(shape):
        raise ValueError(
            f"Block shape for {origin} (= {tuple(block_shape_in)!r}) must have the same "
            f"number of dimensions as the array shape {tuple(shape)!r} "
            f"(block rank {len(block_dims)}, array rank {len(shape)})"
        )
    for i, (d, n) in enumerate(zip(block_dims, shape)):
        size = d.block_size
        if jc.is_symbolic_dim(size) or jc.is_symbolic_dim(n):
            continue  # symbolic (jax.export): >= 1 by construction, checked at run time
        if not isinstance(size, (int, np.integer)) or size <= 0:
            raise ValueError(
                f"Block shape for {origin} (= {tuple(block_shape_in)!r}) has a non-positive "
                f"block size {size!r} in dimension {i}; array shape {tuple(shape)!r}"
            )
        if isinstance(d, bs.Element):
            lo, hi = d.padding
            if lo < 0 or hi < 0:
                raise ValueError(f"Element padding for {origin} dim {i} must be >= 0: {d}")
            if size > n + lo + hi:
                raise ValueError(
                    f"Block shape for {origin} (= {tuple(block_shape_in)!r}): Element block "
                    f"size {size} in dimension {i} neither fits the array dimension {n} nor is "
                    f"allowed to pad beyond padding={d.padding}; array shape {tuple(shape)!r}. "
                    f"Use pl.Element({size}, padding=(lo, hi)) with lo + hi >= {size - n}, "
                    f"or pl.Blocked({size}) for masked edge blocks."
                )
        if isinstance(d, bs.BoundedSlice) and size > n:
            raise ValueError(
                f"Block shape for {origin} (= {tuple(block_shape_in)!r}): BoundedSlice size "
                f"{size} in dimension {i} exceeds the array dimension {n}"
            )


def resolve_block_mapping(origin, spec, array_aval, grid, prefetch_avals,
                          prefetch_tree=None) -> BlockMapping:
    """Validates one operand's BlockSpec and builds its BlockMapping."""
    if spec is None:
        spec = bs.no_block_spec
    if not isinstance(spec, (bs.BlockSpec, bs.NoBlockSpec)):
        raise TypeError(
            f"the spec for {origin} must be a pl.BlockSpec or pl.no_block_spec; got {spec!r}"
        )
    memory_space = None if isinstance(spec, bs.NoBlockSpec) else spec.memory_space
    transforms = tuple(getattr(spec, "transforms", None) or ())
    check_symbolic_block(origin, getattr(spec, "block_shape", None), array_aval)
    if isinstance(spec, bs.NoBlockSpec) or spec.block_shape is None:
        block_dims = tuple(bs.Blocked(n if jc.is_symbolic_dim(n) else int(n) or 1)
                           for n in array_aval.shape)
        whole = True
        index_map = None
        pipeline_mode = None if isinstance(spec, bs.NoBlockSpec) else spec.pipeline_mode
        spec = bs.BlockSpec(None, index_map)
    else:
        block_dims = tuple(bs.canonicalize_block_dim(d) for d in spec.block_shape)
        _check_block_dims(origin, block_dims, array_aval, spec.block_shape)
        whole = False
        pipeline_mode = spec.pipeline_mode
    if whole:
        zero = tuple(0 for _ in block_dims)
        jaxpr, _, consts = jc.trace_kernel_to_jaxpr(
            lambda *a: [jnp.int32(z) for z in zero],
            [jc.ShapedArray((), jnp.int32)] * len(grid)
            + [jc.AbstractRef(a) for a in prefetch_avals],
            f"index_map for {origin}",
        )
        index_map_jaxpr, uses_prefetch = jc.ClosedJaxpr(jaxpr, consts), False
    else:
        index_map_jaxpr, uses_prefetch = _trace_index_map(
            origin, spec, block_dims, array_aval, grid, prefetch_avals, prefetch_tree
        )
    return BlockMapping(
        origin=origin,
        array_aval=array_aval,
        block_dims=block_dims,
        index_map_jaxpr=index_map_jaxpr,
        memory_space=memory_space,
        pipeline_mode=pipeline_mode,
        whole=whole,
        index_map_uses_prefetch=uses_prefetch,
        transforms=transforms,
    )


def _scratch_type(origin, s) -> MemoryRef:
    m = as_memory_ref(s)  # a MemoryRef, or a backend's scratch description
    if m is not None:
        return m
    if isinstance(s, jax.ShapeDtypeStruct):
        return MemoryRef(jc.ShapedArray(s.shape, s.dtype), MemorySpace.ANY)
    raise TypeError(
        f"scratch shape {origin} must be a memory-space buffer such as pl.ANY(shape, dtype) "
        f"or a backend's (e.g. pltpu.VMEM(shape, dtype)); got {s!r}"
    )


def keystr(prefix: str, path) -> str:
    return prefix + jax.tree_util.keystr(path)


def resolve_grid_mapping(
    grid_spec: GridSpec,
    body_args_tree,
    in_avals: Sequence[Any],
    out_tree,
    out_avals: Sequence[Any],
    input_output_aliases: dict[int, int],
    in_paths: Sequence[Any],
    out_paths: Sequence[Any],
    prefetch_tree=None,
) -> tuple[GridMapping, Any]:
    """Validates the grid spec against the operands; returns (GridMapping, scratch tree).

    ``prefetch_tree`` is the tuple treedef of the scalar-prefetch arguments (each may be
    a pytree, or ``None``); the grid mapping counts their leaves."""
    grid = _check_grid(grid_spec.grid)
    nsp = grid_spec.num_scalar_prefetch
    if nsp > len(in_avals) and prefetch_tree is None:
        raise ValueError(
            f"num_scalar_prefetch={nsp} but pallas_call got only {len(in_avals)} operands"
        )
    if prefetch_tree is not None:
        nsp = prefetch_tree.num_leaves
    prefetch_avals = tuple(in_avals[:nsp])
    # The in_specs tree covers the operands after the scalar-prefetch ones.
    body_in_avals = in_avals[nsp:]
    body_paths = in_paths[nsp:]
    body_tree = body_args_tree
    flat_in_specs = _flatten_specs(grid_spec.in_specs, body_tree, "`in_specs`", "`inputs`",
                                   body_paths, body_in_avals)
    flat_out_specs = _flatten_specs(grid_spec.out_specs, out_tree, "`out_specs`",
                                    "`out_shape`", out_paths, out_avals)
    mappings = []
    for path, spec, aval in zip(body_paths, flat_in_specs, body_in_avals):
        mappings.append(resolve_block_mapping(path, spec, aval, grid, prefetch_avals,
                                              prefetch_tree))
    for path, spec, aval in zip(out_paths, flat_out_specs, out_avals):
        mappings.append(resolve_block_mapping(path, spec, aval, grid, prefetch_avals,
                                              prefetch_tree))

    scratch_flat, scratch_tree = jax.tree_util.tree_flatten_with_path(
        grid_spec.scratch_shapes,
        is_leaf=is_buffer_type,
    )
    scratch_types, scratch_origins = [], []
    for path, s in scratch_flat:
        origin = keystr("scratch_shapes", path)
        scratch_types.append(_scratch_type(origin, s))
        scratch_origins.append(origin)

    aliases = []
    n_ops = len(in_avals)
    for i, o in sorted(input_output_aliases.items()):
        if not 0 <= i < n_ops:
            raise ValueError(
                f"input_output_aliases contains the mapping '{i}:{o}' with input index {i} "
                f"outside the range [0, {n_ops}) (pallas_call has {n_ops} inputs)"
            )
        if not 0 <= o < len(out_avals):
            raise ValueError(
                f"input_output_aliases contains the mapping '{i}:{o}' with output index {o} "
                f"outside the range [0, {len(out_avals)}) (pallas_call has "
                f"{len(out_avals)} outputs)"
            )
        ia, oa = in_avals[i], out_avals[o]
        if tuple(ia.shape) != tuple(oa.shape) or ia.dtype != oa.dtype:
            raise ValueError(
                f"input_output_aliases contains the mapping '{i}:{o}' referring to "
                f"input[{i}] with abstract value {ia.str_short()} ({in_paths[i]}) and "
                f"output[{o}] with a different abstract value {oa.str_short()} "
                f"({out_paths[o]}); aliased operands must have the same shape and dtype"
            )
        aliases.append((i, o))
    gm = GridMapping(
        grid=grid,
        grid_names=None,
        num_scalar_prefetch=nsp,
        prefetch_avals=prefetch_avals,
        block_mappings=tuple(mappings),
        num_inputs=len(body_in_avals),
        num_outputs=len(out_avals),
        scratch_types=tuple(scratch_types),
        scratch_origins=tuple(scratch_origins),
        input_output_aliases=tuple(aliases),
    )
    return gm, scratch_tree
