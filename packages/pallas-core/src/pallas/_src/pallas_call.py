"""``pallas_call``: trace a kernel over Refs, validate its grid, bind ``pallas_call_p``.

``pallas_call_p`` is the one primitive of pallas-core. Its lowering asks the plugin
registry for a backend for the platform being lowered (or runs the interpreter when
``interpret=True``); its impl jit-compiles that lowering.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas._src import block_spec as bs
from pallas._src import captured, config, partitioning, ref_args
from pallas._src import jax_compat as jc
from pallas._src.compiler_params import CompilerParams, FrozenParams
from pallas._src.cost import CostEstimate
from pallas._src.dynamic_grid import (
    check_dynamic_grid_support,
    check_dynamic_shapes_support,
    grid_repr,
)
from pallas._src.emulation.call import lower_emulated
from pallas._src.emulation.device import emulated_device
from pallas._src.grid_spec import (
    GridMapping,
    GridSpec,
    keystr,
    resolve_grid_mapping,
    unzip_dynamic_grid,
)
from pallas._src.interpreter.grid_runner import Checks, error_vector_size, raise_if_error
from pallas._src.interpreter.lowering import lower_with_interpreter
from pallas._src.interpreter.modes import InterpretMode, resolve_interpret
from pallas._src.memory import MemorySpace, array_dtype
from pallas._src.primitives.debug import debug_checks_requested
from pallas._src.primitives.grid import tracing_grid
from pallas._src.registry import artifacts, registry
from pallas._src.registry.requests import KernelRequest, LoweringRequest

pallas_call_p = jc.Primitive("pallas_call")
pallas_call_p.multiple_results = True
# Under jit over several devices the call partitions itself (partitioning.py), which
# needs the devices and mesh at lowering.
jc.require_devices_during_lowering(pallas_call_p)


@dataclasses.dataclass(frozen=True)
class InterpretParams:
    """Options of the core interpreter, passed as ``interpret=pl.InterpretParams(...)``.

    ``None`` leaves a check as the global switch says (``pl.enable_bounds_checks``,
    ``pl.enable_poison_buffers``, ``pl.enable_debug_checks``).
    """

    bounds_checks: bool | None = None
    uninitialized_checks: bool | None = None
    debug_checks: bool | None = None
    vectorize: bool = True  # False runs the grid point by point, never vectorised


# ------------------------------------------------------------------------------------
# Tracing.


def _is_shape_dtype(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _out_avals(out_shape) -> tuple[list, Any, list[str]]:
    leaves, tree = jax.tree_util.tree_flatten_with_path(out_shape)
    avals, paths = [], []
    single = tree.num_leaves == 1 and not jax.tree_util.treedef_children(tree)
    for path, leaf in leaves:
        origin = "outputs" if single and not path else keystr("outputs", path)
        if not _is_shape_dtype(leaf) and callable(getattr(leaf, "get_memory_ref", None)):
            # A memory type used bare (pltpu.SemaphoreType.DMA): one of it, as upstream.
            leaf = leaf.get_memory_ref()
        if not _is_shape_dtype(leaf):
            raise TypeError(
                f"out_shape {origin} must be shape-and-dtype-like (jax.ShapeDtypeStruct or "
                f"an array); got {leaf!r} of type {type(leaf).__name__}"
            )
        try:
            # Symbolic dims (jax.export shape polymorphism) stay symbolic.
            shape = tuple(d if jc.is_symbolic_dim(d) else int(d) for d in leaf.shape)
            dtype = array_dtype(leaf.dtype)
        except TypeError as e:
            raise TypeError(f"out_shape {origin} has an invalid shape or dtype: {e}") from None
        # Inside shard_map, the varying mesh axes the out_shape declares (upstream's
        # manual_axis_type); without one they are inferred from the operands.
        mat = getattr(leaf, "manual_axis_type", None)
        avals.append(jc.ShapedArray(shape, dtype) if mat is None
                     else jc.ShapedArray(shape, dtype, sharding=jc.core.get_cur_mesh_sharding(),
                                         manual_axis_type=mat))
        paths.append(origin)
    return avals, tree, paths


def _splat(tree_value) -> tuple:
    """Top-level elements of a tuple/list become separate kernel arguments."""
    if isinstance(tree_value, (tuple, list)):
        return tuple(tree_value)
    return (tree_value,)


class KernelTracingError(ValueError):
    """An error in the kernel body, found while tracing it."""


def _ref_in_traceback(exc: BaseException, ref_names: dict[int, str]) -> str | None:
    """Finds which kernel ref a failing state operation was applied to."""
    tb = exc.__traceback__
    found = None
    while tb is not None:
        for key in ("ref", "ref_or_view", "x_ref_or_view", "tracer"):
            v = tb.tb_frame.f_locals.get(key)
            if v is None:
                continue
            base = getattr(v, "ref", v)
            name = ref_names.get(id(base))
            if name is not None:
                found = name
        tb = tb.tb_next
    return found


def trace_kernel(kernel: Callable, gm: GridMapping, in_tree_args, out_tree, scratch_tree,
                 name: str, prefetch_tree=None, lift_captures: bool = False):
    """Traces the kernel over ref avals in the order prefetch, inputs, outputs, scratch
    (the scalar-prefetch refs grouped as ``prefetch_tree``, the arguments' treedef)."""
    nsp = gm.num_scalar_prefetch
    pf_avals = [jc.AbstractRef(a) for a in gm.prefetch_avals]
    in_avals = [bm.ref_aval for bm in gm.in_block_mappings]
    out_avals = [bm.ref_aval for bm in gm.out_block_mappings]
    scratch_avals = [t.get_ref_aval() for t in gm.scratch_types]
    origins = (
        [f"scalar prefetch args[{i}]" for i in range(nsp)]
        + [bm.origin for bm in gm.block_mappings]
        + list(gm.scratch_origins)
    )
    all_avals = [*pf_avals, *in_avals, *out_avals, *scratch_avals]
    ref_names: dict[int, str] = {}

    def flat_kernel(*refs):
        for r, o in zip(refs, origins):
            ref_names[id(r)] = o
        pf = refs[:nsp]
        ins = refs[nsp : nsp + gm.num_inputs]
        outs = refs[nsp + gm.num_inputs : nsp + gm.num_inputs + gm.num_outputs]
        scratch = refs[nsp + gm.num_inputs + gm.num_outputs :]
        in_args = jax.tree_util.tree_unflatten(in_tree_args, ins)
        out_args = jax.tree_util.tree_unflatten(out_tree, outs)
        scratch_args = jax.tree_util.tree_unflatten(scratch_tree, scratch)
        if prefetch_tree is not None:
            pf = jax.tree_util.tree_unflatten(prefetch_tree, pf)
        groups = (tuple(pf), _splat(in_args), _splat(out_args))
        args, kwargs = [a for g in groups for a in g], {}
        if isinstance(scratch_args, Mapping):  # scratch_shapes=dict(...): by keyword
            kwargs = dict(scratch_args)
        else:
            args.extend(_splat(scratch_args))
        _check_kernel_arity(kernel, name, args, kwargs,
                            [len(g) for g in groups] + [len(args) + len(kwargs) - sum(map(len, groups))])
        result = kernel(*args, **kwargs)
        if result is not None:
            raise KernelTracingError(
                f"The kernel function in the pallas_call {name} should return None. It "
                f"returns {_short(result)}; kernels write their results into the output refs."
            )
        return []

    try:
        # Without shard_map's varying-axes typing inside the kernel (as upstream): a
        # kernel's values live on one core, and JAX would insert pvary into its body.
        with tracing_grid(gm.grid), jc.check_vma(False):
            jaxpr, _, consts = jc.trace_kernel_to_jaxpr(flat_kernel, all_avals, name, origins)
    except KernelTracingError:
        raise
    except (ValueError, TypeError) as e:
        msg = str(e)
        if ("swap" in msg or "Invalid shape" in msg or "Invalid dtype" in msg
                or "store of a value" in msg):
            which = _ref_in_traceback(e, ref_names)
            where = f" into {which}" if which else ""
            ref_shapes = ", ".join(
                f"{o}: {a.inner_aval.str_short()}" for o, a in zip(origins, all_avals)
            )
            raise type(e)(
                f"In the kernel of pallas_call {name}: a store{where} does not fit the ref. "
                f"{msg.strip()} Kernel refs: {ref_shapes}."
            ).with_traceback(e.__traceback__) from None
        raise
    if consts:
        # (pl.kernel lifts captured traced scalars and refs into operands: ``captured``)
        non_scalar = [c for c in consts if (np.ndim(c) != 0 or isinstance(c, jax.core.Tracer))
                      and not captured.hoistable([c], scalars=lift_captures)]
        if non_scalar:
            shapes = ", ".join(jax.typeof(c).str_short() for c in non_scalar)
            raise ValueError(
                f"The kernel function in the pallas_call {name} captures constants "
                f"[{shapes}]: a kernel captures non-Ref constants only as concrete "
                "scalars (Refs it closes over become operands). You should pass them as "
                "inputs (with a BlockSpec)."
            )
    return jc.ClosedJaxpr(jaxpr, consts)


def _check_kernel_arity(kernel, name, args, kwargs, counts) -> None:
    """Raises a TypeError naming the kernel and what ``pallas_call`` passes it when the
    kernel's signature cannot take those arguments (Python's own message names neither)."""
    try:
        sig = inspect.signature(kernel)
    except (TypeError, ValueError):  # builtins and other callables without a signature
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        native = _native_call_error(kernel, args, kwargs) or str(e)
        n_pf, n_in, n_out, n_scratch = counts
        parts = [f"{n_pf} scalar-prefetch operand(s)", f"{n_in} input ref(s)",
                 f"{n_out} output ref(s)", f"{n_scratch} scratch ref(s)"]
        how = f"{len(args)} positional argument(s)"
        if kwargs:
            how += f" and keyword argument(s) {sorted(kwargs)}"
        # Python's own message first (upstream's, which users match), then what it omits.
        raise TypeError(
            f"{native}. The kernel function in the pallas_call {name} cannot take the "
            f"arguments pallas_call passes it: {how}, that is {', '.join(parts)} (in that "
            f"order), but its signature is {_signature_str(kernel, sig)}."
        ) from None


def _native_call_error(kernel, args, kwargs) -> str | None:
    """Python's message for calling ``kernel`` so (the call fails while binding its
    arguments, before any of the kernel's code runs); None if it does not fail so."""
    try:
        kernel(*args, **kwargs)
    except TypeError as e:
        if e.__traceback__ is not None and e.__traceback__.tb_next is None:
            return str(e)
        return None
    return None


def _signature_str(kernel, sig) -> str:
    base = getattr(kernel, "__name__", None) or type(kernel).__name__
    return f"{base}{sig}"


def _short(x) -> str:
    try:
        return jax.typeof(x).str_short()
    except Exception:  # noqa: BLE001
        return type(x).__name__


def _kernel_name(kernel, name):
    if name:
        return name
    base = getattr(kernel, "__name__", None) or type(kernel).__name__
    code = getattr(kernel, "__code__", None)
    if code is not None:
        return f"{base} at {code.co_filename.split('/')[-1]}:{code.co_firstlineno}"
    return base


def pallas_call(
    kernel: Callable[..., None],
    out_shape: Any,
    *,
    grid_spec: GridSpec | None = None,
    grid: Any = (),
    in_specs: Any = bs.no_block_spec,
    out_specs: Any = bs.no_block_spec,
    scratch_shapes: Any = (),
    input_output_aliases: Mapping[int, int] = {},  # noqa: B006 - upstream signature
    debug: bool = False,
    interpret: Any = False,
    name: str | None = None,
    compiler_params: CompilerParams | None = None,
    cost_estimate: CostEstimate | None = None,
    metadata: dict[str, str] | None = None,
    backend: str | None = None,
) -> Callable[..., Any]:
    """Makes a JAX-callable from ``kernel`` run over ``grid`` (upstream-compatible).

    Extra over upstream: ``backend=`` picks a backend by name.
    """
    return pallas_call_with_axes(
        kernel, out_shape, grid_spec=grid_spec, grid=grid, in_specs=in_specs,
        out_specs=out_specs, scratch_shapes=scratch_shapes,
        input_output_aliases=input_output_aliases, debug=debug, interpret=interpret,
        name=name, compiler_params=compiler_params, cost_estimate=cost_estimate,
        metadata=metadata, backend=backend,
    )


def pallas_call_with_axes(kernel, out_shape, *, grid_spec=None, grid=(),
                          in_specs=bs.no_block_spec, out_specs=bs.no_block_spec,
                          scratch_shapes=(), input_output_aliases=None, debug=False,
                          interpret=False, name=None, compiler_params=None,
                          cost_estimate=None, metadata=None, backend=None,
                          grid_names=None, mesh=None):
    """``pallas_call`` whose grid axes may be named (``lax.axis_index(name)`` works);
    ``mesh`` (from ``pl.kernel``) is kept on the grid mapping for backends."""
    input_output_aliases = input_output_aliases or {}
    as_written = interpret
    grid, named = _split_named_grid(grid)
    if named is not None:
        if grid_names is not None:
            raise ValueError("pallas_call: name the grid axes either in grid=(('i', n), ...) "
                             "or with grid_names, not both")
        grid_names = named
    if grid_spec is None:
        grid_spec = GridSpec(grid, in_specs, out_specs, scratch_shapes)
    else:
        if grid not in ((), None) or in_specs is not bs.no_block_spec or (
            out_specs is not bs.no_block_spec or scratch_shapes not in ((), [])
        ):
            raise ValueError(
                "pallas_call takes either grid_spec or grid/in_specs/out_specs/"
                "scratch_shapes, not both"
            )
    grid, named = _split_named_grid(grid_spec.grid)  # GridSpec(grid=(("i", n), ...))
    if named is not None:
        if grid_names is not None:
            raise ValueError("pallas_call: name the grid axes either in the grid or with "
                             "grid_names, not both")
        grid_names = named
        grid_spec = dataclasses.replace(grid_spec, grid=grid)
    # Grid sizes known only at run time (traced values inside jit, symbolic dimensions
    # under jax.export) become the first operands of pallas_call_p, as upstream.
    static_grid, grid_bounds = unzip_dynamic_grid(grid_spec.grid)
    if grid_bounds:
        if grid_names is not None:
            raise NotImplementedError(
                f"pallas_call: a named grid with dynamic sizes is not supported (grid "
                f"names {tuple(grid_names)}); give the named axes static sizes")
        grid_spec = _with_grid(grid_spec, static_grid)
    if isinstance(out_shape, list):
        out_shape = tuple(out_shape)  # as upstream: a list of outputs comes back a tuple
    out_avals, out_tree, out_paths = _out_avals(out_shape)
    kname = _kernel_name(kernel, name)
    if isinstance(compiler_params, Mapping) and not isinstance(compiler_params, FrozenParams):
        # The dict form {backend name: {option: value}}: checked now, read at lowering
        # by whichever backend is chosen (a dict selects none).
        registry.check_compiler_params_dict(compiler_params)
        compiler_params = FrozenParams(compiler_params)
    if backend is not None or (compiler_params is not None and not isinstance(
            compiler_params, Mapping)):
        explicit = registry.requested_backend(backend, compiler_params)
        if explicit is not None and not interpret:
            registry.get_backend(explicit)  # fail at trace time if missing

    trace_cache: dict = {}

    def _trace(args, in_avals, in_paths):
        nsp = grid_spec.num_scalar_prefetch
        if nsp > len(args):
            raise ValueError(f"num_scalar_prefetch={nsp} but pallas_call got only "
                             f"{len(args)} operands")
        body_args = args[nsp:] if nsp else args
        body_tree = jax.tree_util.tree_structure(tuple(body_args))
        # Scalar-prefetch arguments may be pytrees (or None), as upstream allows.
        pf_tree = jax.tree_util.tree_structure(tuple(args[:nsp])) if nsp else None
        gm, scratch_tree = resolve_grid_mapping(
            grid_spec, body_tree, in_avals, out_tree, out_avals,
            dict(input_output_aliases), in_paths, out_paths, pf_tree,
        )
        wants_checks = isinstance(interpret, InterpretParams) and bool(interpret.debug_checks)
        axes = []
        if grid_names is not None:
            gm = dataclasses.replace(gm, grid_names=tuple(grid_names))
            axes = list(zip(grid_names, gm.grid))
        if mesh is not None:
            gm = dataclasses.replace(gm, mesh=mesh)
        if grid_bounds:
            gm = dataclasses.replace(gm, grid_bound_dims=tuple(
                b if jc.is_symbolic_dim(b) else None for b in grid_bounds))
        with jc.extend_axis_env_nd(axes), debug_checks_requested(wants_checks):
            jaxpr = trace_kernel(kernel, gm, body_tree, out_tree, scratch_tree, kname,
                                 pf_tree, lift_captures=mesh is not None)
        if debug:
            print(f"The kernel jaxpr for pallas_call {kname}:", file=sys.stdout)
            print(jaxpr, file=sys.stdout)
            print(f"The grid mapping for pallas_call {kname}:", file=sys.stdout)
            print(gm, file=sys.stdout)
        return gm, jaxpr

    @functools.wraps(kernel)
    def wrapped(*args):
        if any(ref_args.is_ref(x) for x in jax.tree_util.tree_leaves(args)):
            return ref_args.call_with_ref_operands(
                _remake, args, kernel=kernel, out_shape=out_shape,
                in_specs=grid_spec.in_specs, out_specs=grid_spec.out_specs,
                input_output_aliases=input_output_aliases,
                num_scalar_prefetch=grid_spec.num_scalar_prefetch)
        interpret = resolve_interpret(as_written)  # forced interpret modes apply at call
        flat_args, in_tree = jax.tree_util.tree_flatten(args)
        leaves_with_paths = jax.tree_util.tree_flatten_with_path(args)[0]
        in_paths = [keystr("args", p) for p, _ in leaves_with_paths]
        in_avals = []
        for p, x in zip(in_paths, flat_args):
            try:
                a = jax.typeof(x)
            except TypeError:
                raise TypeError(f"pallas_call operand {p} is not an array: {x!r}") from None
            if isinstance(a, jc.AbstractRef):  # (ref_args rewrites such calls first)
                raise TypeError(f"pallas_call operand {p} is a Ref ({a})")
            in_avals.append(a.update(weak_type=False) if hasattr(a, "update") else a)
        # Tracing is cached per operand types (and trace-time switches), so repeated
        # eager calls reuse one kernel jaxpr and hence one compiled executable.
        key = (in_tree, tuple(in_avals), config.enable_debug_checks.value)
        cached = trace_cache.get(key)
        if cached is None:
            cached = trace_cache[key] = _trace(args, in_avals, in_paths)
        gm, jaxpr = cached
        if captured.hoistable(jaxpr.consts, scalars=mesh is not None):
            # Refs the body closes over (and, for pl.kernel, traced scalars) become
            # operands: a Ref whole and updated in place.
            return captured.call_hoisting_captures(
                _remake, jaxpr, args, out_shape=out_shape, in_specs=grid_spec.in_specs,
                out_specs=grid_spec.out_specs, input_output_aliases=input_output_aliases,
                ref_space=(getattr(mesh, "default_memory_space", None) if mesh is not None
                           else MemorySpace.ANY),
                scalar_space=getattr(mesh, "scalar_memory_space", None),
                scalars=mesh is not None, num_scalar_prefetch=grid_spec.num_scalar_prefetch)
        explicit = registry.requested_backend(backend, compiler_params)
        if explicit is not None and not interpret:
            b = registry.get_backend(explicit)
            if gm.num_dynamic_grid_bounds:
                check_dynamic_grid_support(b, gm, kname)
            b.artifact(KernelRequest(  # built (validated) once, kept for the lowering
                jaxpr=jaxpr, grid_mapping=gm,
                compiler_params=registry.resolve_compiler_params(b, compiler_params),
                name=kname, out_avals=tuple(out_avals), cost_estimate=cost_estimate,
                metadata=_freeze(metadata), debug=bool(debug)))
        checks = _checks_for(interpret) if interpret else None
        bounds = [_grid_bound(b) for b in grid_bounds]
        flat_args = jc.insert_pvary(*bounds, *flat_args)  # (inside shard_map; else a no-op)
        outs = pallas_call_p.bind(
            *flat_args,
            checks=checks,
            jaxpr=jaxpr,
            grid_mapping=gm,
            interpret=_freeze_interpret(interpret),
            debug=debug,
            name=kname,
            compiler_params=compiler_params,
            cost_estimate=cost_estimate,
            metadata=_freeze(metadata),
            backend=backend,
            out_avals=tuple(out_avals),
        )
        if checks is not None and checks.any:
            *outs, err = outs
            raise_if_error(jaxpr, gm, err)
        return jax.tree_util.tree_unflatten(out_tree, outs)

    def _remake(new_kernel, new_out_shape, new_in_specs, new_out_specs, new_aliases):
        """This call with Ref operands turned into aliased outputs (see ``ref_args``)."""
        if grid_bounds:
            raise NotImplementedError("pallas_call: Ref operands with a grid sized at run "
                                      "time are not supported; pass the ref's value")
        spec = copy.copy(grid_spec)
        object.__setattr__(spec, "in_specs", new_in_specs)
        object.__setattr__(spec, "out_specs", new_out_specs)
        return pallas_call_with_axes(
            new_kernel, new_out_shape, grid_spec=spec, input_output_aliases=new_aliases,
            debug=debug, interpret=as_written, name=kname, compiler_params=compiler_params,
            cost_estimate=cost_estimate, metadata=metadata, backend=backend,
            grid_names=grid_names, mesh=mesh)

    return PallasCallFunction(wrapped)


class PallasCallFunction:
    """What ``pallas_call`` returns: calling it runs the call (eagerly, as written); as
    upstream's (a jitted function) it also has the ahead-of-time stages ``trace``,
    ``lower`` (``pl.pallas_call(...).lower(x).compile()``) and ``eval_shape``. They are
    methods, not attributes, so wrappers that copy a function's ``__dict__``
    (``functools.wraps`` in ``jax.vmap``) do not take them over."""

    def __init__(self, fun: Callable):
        functools.update_wrapper(self, fun)
        self._fun = fun
        self._jitted = jax.jit(fun, inline=True)

    def __call__(self, *args):
        return self._fun(*args)

    def trace(self, *args):
        return self._jitted.trace(*args)

    def lower(self, *args):
        return self._jitted.lower(*args)

    def eval_shape(self, *args):
        return self._jitted.eval_shape(*args)


def _with_grid(grid_spec, grid):
    """``grid_spec`` with another grid (GridSpec subclasses have their own __init__)."""
    new = copy.copy(grid_spec)
    object.__setattr__(new, "grid", tuple(grid))
    return new


def _grid_bound(b):
    """A dynamic grid size as the int32 scalar operand that carries it."""
    if jc.is_symbolic_dim(b):
        return jc.dimension_as_value(b).astype(jnp.int32)
    return jnp.asarray(b, jnp.int32)


def _split_named_grid(grid):
    """``grid=(("i", 4), ("j", 2))`` (upstream's named grid) -> ``((4, 2), ("i", "j"))``;
    other grids are returned as they are, with no names. Naming some axes but not all
    is an error naming the grid."""
    if not isinstance(grid, tuple | list) or not any(isinstance(g, tuple) for g in grid):
        return grid, None
    if not all(isinstance(g, tuple) and len(g) == 2 and isinstance(g[0], str) for g in grid):
        raise TypeError(
            f"pallas_call grid={tuple(grid)!r}: a named grid gives every axis as a "
            f"(name, size) pair, e.g. grid=(('i', 4), ('j', 2))")
    return tuple(g[1] for g in grid), tuple(g[0] for g in grid)


def _freeze(metadata):
    if metadata is None:
        return None
    return tuple(sorted(metadata.items()))


def _freeze_interpret(interpret):
    """``interpret`` as an equation parameter: None is False; a bool, ``pl.InterpretParams``
    or a backend's params (an ``InterpretMode``, e.g. ``pltpu.InterpretParams``) as is."""
    return False if interpret is None else interpret


# ------------------------------------------------------------------------------------
# The primitive's rules.


def _abstract_eval(*avals, out_avals, checks, grid_mapping, **params):
    if checks is None or not checks.any:
        return list(out_avals)
    return [*out_avals, jc.ShapedArray((error_vector_size(grid_mapping),), jnp.int32)]


pallas_call_p.def_abstract_eval(_abstract_eval)


def _typecheck(_, *in_atoms, jaxpr, grid_mapping, **params):
    """Under ``jax_enable_checks``: the kernel is checked with its named grid axes bound
    (``pl.kernel`` on a mesh, named grids), as it was traced."""
    names = grid_mapping.grid_names
    axes = list(zip(names, grid_mapping.grid)) if names else []
    with jc.extend_axis_env_nd(axes):
        jc.check_jaxpr(getattr(jaxpr, "jaxpr", jaxpr))
    # The types and effects the call was traced with (transforms/effects.py: outputs
    # vary over the manual axes their operands vary over; the kernel's effects other
    # than those on its own refs, grid axes and kernel-local effects).
    return pallas_call_p.abstract_eval(*(a.aval for a in in_atoms), jaxpr=jaxpr,
                                       grid_mapping=grid_mapping, **params)


jc.register_typecheck(pallas_call_p, _typecheck)


def _impl(*args, **params):
    return jc.dispatch_apply_primitive(pallas_call_p, *args, **params)


pallas_call_p.def_impl(_impl)


def _checks_for(interpret):
    if _interpret_hook(interpret) is not None:
        return None  # a backend's interpret mode does its own checking
    base = Checks.from_config()
    if isinstance(interpret, InterpretParams):
        return Checks(
            bounds=base.bounds if interpret.bounds_checks is None else interpret.bounds_checks,
            uninitialized=base.uninitialized if interpret.uninitialized_checks is None
            else interpret.uninitialized_checks,
            debug=base.debug if interpret.debug_checks is None else interpret.debug_checks,
            vectorize=interpret.vectorize,
        )
    return base


def _interpret_hook(interpret):
    """A backend's interpret mode (e.g. ``pltpu.InterpretParams``) lowers the call itself:
    its params object is a :class:`pallas.plugins.InterpretMode`."""
    return interpret.lower_pallas_call if isinstance(interpret, InterpretMode) else None


def _lowering(ctx, *in_nodes, jaxpr, grid_mapping, interpret, debug, name, compiler_params,
              cost_estimate, metadata, backend, out_avals, checks):
    hook = _interpret_hook(interpret)
    if hook is None and partitioning.wants_partitioning(ctx, grid_mapping, checks):
        return partitioning.lower_partitioned(  # over devices: see partitioning.py
            ctx, *in_nodes, jaxpr=jaxpr, grid_mapping=grid_mapping,
            interpret=interpret, debug=debug, name=name, compiler_params=compiler_params,
            cost_estimate=cost_estimate, metadata=metadata, backend=backend,
            out_avals=out_avals, checks=checks, bind=_bind)
    if hook is not None:
        if grid_mapping.num_dynamic_grid_bounds and not interpret.supports_dynamic_grid:
            raise NotImplementedError(
                f"pallas_call {name}: dynamic grid bounds not supported in "
                f"{type(interpret).__name__} (grid {grid_repr(grid_mapping)}); use "
                f"interpret=True (the core interpreter) or static grid sizes")
        return hook(ctx, *in_nodes, jaxpr=jaxpr, grid_mapping=grid_mapping,
                    compiler_params=compiler_params, name=name)
    if interpret:
        return lower_with_interpreter(ctx, *in_nodes, jaxpr=jaxpr, grid_mapping=grid_mapping,
                                      checks=checks)
    platforms = ctx.module_context.platforms
    device = emulated_device()

    def rule_for(platform):
        if platform == "cpu" and device is not None:
            # An emulated device: the code generated for it, run on the host.
            return functools.partial(
                lower_emulated, dev=device, jaxpr=jaxpr, grid_mapping=grid_mapping,
                name=name, compiler_params=compiler_params, cost_estimate=cost_estimate,
                metadata=metadata, backend=backend, out_avals=out_avals, debug=debug)
        b = registry.select_backend(platform, backend, compiler_params)

        def rule(ctx, *in_nodes):
            nb = grid_mapping.num_dynamic_grid_bounds
            if nb:
                check_dynamic_grid_support(b, grid_mapping, name)
            check_dynamic_shapes_support(b, grid_mapping, name)
            request = LoweringRequest(
                ctx=ctx, in_nodes=in_nodes[nb:], grid_bounds=tuple(in_nodes[:nb]),
                jaxpr=jaxpr, grid_mapping=grid_mapping,
                compiler_params=registry.resolve_compiler_params(b, compiler_params),
                cost_estimate=cost_estimate, name=name, metadata=metadata,
                out_avals=tuple(out_avals), platform=platform, debug=bool(debug))
            return b.lower(dataclasses.replace(
                request, artifact=artifacts.cached_artifact(b, request)))

        return rule

    if len(platforms) == 1:
        return rule_for(platforms[0])(ctx, *in_nodes)
    rules = {p: rule_for(p) for p in platforms}
    return jc.mlir.lower_per_platform(ctx, f"pallas_call {name}", rules, None,
                                      jc.effects.no_effects, *in_nodes)


def _bind(args, params):
    return pallas_call_p.bind(*args, **params)


def split_call(params, mesh, arg_shapes):
    """What every device runs for one ``pallas_call_p`` (its equation's ``params``) whose
    operands are sharded: see :func:`pallas._src.partitioning.split_call`."""
    return partitioning.split_call(params, mesh, arg_shapes, bind=_bind)


jc.mlir.register_lowering(pallas_call_p, _lowering)
