"""Meshes of cores, and the two ways to run code on them: ``core_map`` and ``kernel``.

A mesh names its axes (``lax.axis_index(name)`` inside the body gives the core's
coordinate) and says which backend runs it. Backends subclass :class:`Mesh`
(``pltpu.create_tensorcore_mesh``, ``plsc.VectorSubcoreMesh``, ...); :class:`CoreMesh`
is the backend-neutral one the interpreter runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
from jax import lax

from pallas._src import block_spec as bs
from pallas._src import jax_compat as jc
from pallas._src.interpreter.evaluator import (
    Cell,
    KernelContext,
    _copy_ctx,
    _Threaded,
    _unique_cells,
    eval_jaxpr,
)
from pallas._src.interpreter.modes import resolve_interpret
from pallas._src.interpreter.rules import register_interpret_rule
from pallas._src.memory import MemorySpace, as_memory_ref, is_buffer_type
from pallas._src.pallas_call import pallas_call_with_axes
from pallas._src.primitives.scoped import fresh_cell, operand_effects
from pallas._src.registry.registry import backend_for_core_type


class Mesh:
    """Base class of meshes. Subclasses define ``shape`` and may set ``backend``."""

    backend: str | None = None
    default_memory_space: Any = MemorySpace.ANY
    # Where pl.kernel puts the traced scalars a body closes over (None: the default).
    scalar_memory_space: Any = None

    @property
    def shape(self) -> Mapping[str, int]:
        raise NotImplementedError

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(self.shape)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.shape.values())

    def kernel_compiler_params(self, compiler_params: Any) -> Any:
        """The compiler params of the ``pallas_call`` that ``pl.kernel`` runs on this mesh
        (a backend's mesh may fill in e.g. its dimension semantics)."""
        return compiler_params

    def discharge_core_map(self, interpret: Any):
        """A backend's simulation of ``core_map`` on this mesh: a function
        ``(in_avals, args, eqn_params) -> new ref values``, or None for the interpreter."""
        return None


@dataclasses.dataclass(frozen=True)
class CoreMesh(Mesh):
    """A backend-neutral mesh, e.g. ``CoreMesh(core=2)``; runs in the interpreter."""

    axes: tuple[tuple[str, int], ...]
    backend: str | None = None

    def __init__(self, axes: Mapping[str, int] | None = None, *, backend: str | None = None,
                 **kw_axes: int):
        merged = dict(axes or {}, **kw_axes)
        object.__setattr__(self, "axes", tuple((str(k), int(v)) for k, v in merged.items()))
        object.__setattr__(self, "backend", backend)

    @property
    def shape(self) -> Mapping[str, int]:
        return dict(self.axes)


def mesh_axes(mesh: Any) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(axis names, axis sizes) of ``mesh``: a :class:`Mesh`, or any object with an
    ordered ``shape`` mapping of axis name to size (as upstream's meshes have)."""
    if isinstance(mesh, Mesh):
        return mesh.axis_names, mesh.sizes
    shape = getattr(mesh, "shape", None)
    if not isinstance(shape, Mapping):
        raise TypeError(f"pl.kernel: mesh must be a pl.Mesh (e.g. plsc.VectorSubcoreMesh, "
                        f"pltpu.create_tensorcore_mesh(...)) or have a mapping `shape` of "
                        f"axis name to size; got {type(mesh).__name__} with shape "
                        f"{shape!r}")
    return tuple(str(k) for k in shape), tuple(int(v) for v in shape.values())


def mesh_backend(mesh: Any) -> str | None:
    """The backend that runs ``mesh``: its ``backend`` for a :class:`Mesh`; otherwise
    the installed backend claiming its ``core_type`` (``Backend.core_types``)."""
    if isinstance(mesh, Mesh):
        return mesh.backend
    core_type = getattr(mesh, "core_type", None)
    if core_type is None:
        return None
    return backend_for_core_type(core_type)


# ------------------------------------------------------------------------------------
# kernel: a pallas_call whose grid is the mesh and whose operands are whole refs.


class _NotSpecified:
    def __repr__(self) -> str:
        return "<not-specified>"


NOT_SPECIFIED = _NotSpecified()


def kernel(body: Callable | Any = NOT_SPECIFIED, out_type: object = (), *, mesh: Mesh,
           scratch_types: Any = (), compiler_params: Any = None, interpret: Any = False,
           cost_estimate: Any = None, debug: bool = False, name: str | None = None,
           metadata: dict[str, str] | None = None):
    """Runs ``body(*in_refs, *out_refs, *scratch_refs)`` once on every core of ``mesh``.

    Operands and results are whole arrays in the mesh's default memory space; the
    result has the structure of ``out_type``. Usable as a decorator.
    """
    if body is NOT_SPECIFIED:
        return lambda b: kernel(b, out_type, mesh=mesh, scratch_types=scratch_types,
                                compiler_params=compiler_params, interpret=interpret,
                                cost_estimate=cost_estimate, debug=debug, name=name,
                                metadata=metadata)
    names, sizes = mesh_axes(mesh)
    # A mesh may say how the pallas_call running it is compiled (e.g. a TPU core mesh
    # marks its axis core-parallel, so that interpret modes run one core per point).
    if isinstance(mesh, Mesh):
        compiler_params = mesh.kernel_compiler_params(compiler_params)
    space = getattr(mesh, "default_memory_space", MemorySpace.ANY)

    def run(*args):
        spec = bs.BlockSpec(memory_space=space)
        in_specs = jax.tree_util.tree_map(lambda _: spec, args)
        out_specs = jax.tree_util.tree_map(lambda _: spec, out_type)
        scratch, kernel_body = scratch_types, body
        if isinstance(scratch, Mapping):
            # As upstream: the scratch refs of a mapping reach the body as keyword
            # arguments (the mapping's structure), after the positional in/out refs.
            scratch, tree = jax.tree_util.tree_flatten(dict(scratch), is_leaf=is_buffer_type)
            count = len(scratch)

            def kernel_body(*refs):  # (not functools.wraps: its signature is *refs)
                split = len(refs) - count
                return body(*refs[:split], **tree.unflatten(refs[split:]))

        return pallas_call_with_axes(
            kernel_body, out_type, grid=sizes, grid_names=names, in_specs=in_specs,
            out_specs=out_specs, scratch_shapes=tuple(scratch), interpret=interpret,
            compiler_params=compiler_params, cost_estimate=cost_estimate, debug=debug,
            name=name or getattr(body, "__name__", "kernel"), metadata=metadata,
            backend=None if interpret else mesh_backend(mesh), mesh=mesh,
        )(*args)

    return run


# ------------------------------------------------------------------------------------
# core_map: run a closure over refs on every core.

core_map_p = jc.Primitive("core_map")
core_map_p.multiple_results = True


def core_map(mesh: Mesh, *, compiler_params: Any = None, interpret: bool = False,
             debug: bool = False, cost_estimate: Any = None, name: str | None = None,
             metadata: dict[str, str] | None = None, scratch_shapes: Any = ()):
    """Decorator: runs the zero-argument ``f`` on every core of ``mesh``.

    ``f`` closes over refs (from ``pl.run_state``, ``jax.new_ref`` or an enclosing
    kernel) and reads ``lax.axis_index(name)`` to know which core it is.
    """

    interpret = resolve_interpret(interpret)

    def wrapped(f: Callable[..., None]) -> None:
        types = [as_memory_ref(t) for t in jax.tree_util.tree_leaves(
            scratch_shapes, is_leaf=is_buffer_type)]
        if any(t is None for t in types):
            raise TypeError("pl.core_map(scratch_shapes=...) takes buffer types such as "
                            f"pl.ANY(shape, dtype); got {scratch_shapes!r}")
        avals = [t.get_ref_aval() for t in types]

        def flat(*scratch):
            out = f(*scratch)
            if out is not None:
                raise ValueError("the body of pl.core_map must return None")
            return []

        with jc.extend_axis_env_nd(list(zip(mesh.axis_names, mesh.sizes))):
            jaxpr, _, consts = jc.trace_kernel_to_jaxpr(flat, avals, name or "core_map body")
            # (in the axis env: with jax_enable_checks JAX re-checks the body here)
            jaxpr = jc.convert_constvars_jaxpr(jaxpr)
        if debug:
            print(jaxpr)
        core_map_p.bind(*consts, jaxpr=jaxpr, mesh=mesh, num_consts=len(consts),
                        scratch_types=tuple(types), compiler_params=compiler_params,
                        interpret=interpret, name=name)

    return wrapped


def _core_map_effects(jaxpr, num_consts, mesh) -> set:
    """The body's effects seen from outside: on the operands, less the named axes of the
    mesh itself (bound only inside; an effect on them would escape into a jax.export
    artifact, which cannot serialise it)."""
    own = set(mesh.axis_names)
    return {e for e in operand_effects(jaxpr, num_consts)
            if not (isinstance(e, jc.NamedAxisEffect) and e.name in own)}


core_map_p.def_effectful_abstract_eval(
    lambda *args, jaxpr, num_consts, mesh, **_: ([], _core_map_effects(jaxpr, num_consts, mesh))
)


def _core_map_typecheck(_, *in_atoms, jaxpr, num_consts, mesh, **__):
    """Under ``jax_enable_checks``: the body is checked with the mesh's axes bound (it
    reads ``lax.axis_index`` of them)."""
    with jc.extend_axis_env_nd(list(zip(mesh.axis_names, mesh.sizes))):
        jc.check_jaxpr(jaxpr)
    return [], _core_map_effects(jaxpr, num_consts, mesh)


jc.register_typecheck(core_map_p, _core_map_typecheck)


def _core_map_lowering(ctx, *args, mesh, name, **_):
    """A ``core_map`` reaches XLA only when no ``pl.run_state`` / ``jax.new_ref`` scope
    discharged it (say, a body that touches no ref): refuse it with upstream's words."""
    raise ValueError(
        f"Attempted to lower core_map without discharging. The core_map "
        f"{name or '(unnamed)'} over {mesh!r} was not turned into a kernel: it runs "
        "only inside pl.run_state or on refs from jax.new_ref, and its body must use "
        "at least one of them.")


jc.mlir.register_lowering(core_map_p, _core_map_lowering)


def _run_on_mesh(ctx: KernelContext | None, eqn_params, invals):
    """Runs the body for every mesh point in order, threading the operand cells."""
    p = eqn_params
    mesh = p["mesh"]
    sizes, names = mesh.sizes, mesh.axis_names
    n = 1
    for s in sizes:
        n *= s
    base = ctx if ctx is not None else KernelContext((), ())
    th = _Threaded(base, _unique_cells(invals))

    def body(t, states):
        subst, sub_ctx, inner = th.enter(states)
        idx, rem = [], t
        for s in reversed(sizes):
            idx.append(rem % s)
            rem = rem // s
        point = tuple(reversed(idx))
        sub_ctx = _copy_ctx(sub_ctx, {})
        sub_ctx.grid_indices = point
        sub_ctx.grid = sizes
        sub_ctx.axis_names = names
        scratch = [fresh_cell(t, f"core_map scratch {i}", False)
                   for i, t in enumerate(p["scratch_types"])]
        args = [subst.get(id(x), x) if isinstance(x, Cell) else x for x in invals]
        eval_jaxpr(sub_ctx, p["jaxpr"], (), [*args, *scratch])
        return [c.state() for c in inner]

    states = lax.fori_loop(0, n, body, th.states()) if n > 1 else body(0, th.states())
    th.update(states)


@register_interpret_rule(core_map_p)
def _core_map_rule(ctx, eqn, invals):
    _run_on_mesh(ctx, eqn.params, invals)
    return []


@jc.register_discharge_rule(core_map_p)
def _core_map_discharge(in_avals, out_avals, *args, **params):
    """Outside a kernel (e.g. under ``pl.run_state``) core_map runs in the interpreter, or
    in the simulation the mesh's backend provides (e.g. TPU interpret mode)."""
    hook = getattr(params["mesh"], "discharge_core_map", None)
    simulate = hook(params["interpret"]) if hook is not None else None
    if simulate is not None:
        return simulate(in_avals, list(args), params), []
    cells = [Cell(a, f"core_map operand {i}") if isinstance(av, jc.AbstractRef) else a
             for i, (a, av) in enumerate(zip(args, in_avals))]
    _run_on_mesh(None, params, cells)
    return [c.value if isinstance(c, Cell) else None for c in cells], []


@register_interpret_rule(jc.axis_index_p)
def _axis_index_rule(ctx, eqn, invals):
    name = eqn.params["axis_name"]
    names = ctx.axis_names or ()
    if name not in names:
        # Not a grid axis: an enclosing map (e.g. shard_map) binds it.
        return [jc.axis_index_p.bind(**eqn.params)]
    return [jax.numpy.asarray(ctx.grid_indices[names.index(name)], jax.numpy.int32)]
