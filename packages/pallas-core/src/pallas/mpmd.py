"""``mpmd_map``: one kernel made of several programs, each on its own mesh.

``mpmd_map([(mesh_a, fn_a), (mesh_b, fn_b)], out_types)(*args)`` runs ``fn_a`` on every
core of ``mesh_a`` and ``fn_b`` on every core of ``mesh_b`` (e.g. a SparseCore's vector
subcores and its scalar subcore), all over the same operand and output refs. Upstream
keeps it private (``jax._src.pallas.mpmd``); here it is this public module.

With one mesh/function pair it is ``pl.kernel`` (the mesh's backend lowers it). With
several, no installed backend lowers them into one kernel yet, so they run in the
interpreter (``interpret=True``): one program after another, in the order given, each
seeing the outputs the previous ones wrote (programs that wait on each other's
semaphores therefore cannot be modelled).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from pallas._src import block_spec as bs
from pallas._src.interpreter.modes import resolve_interpret
from pallas._src.memory import MemorySpace
from pallas._src.mesh import kernel, mesh_axes, mesh_backend
from pallas._src.pallas_call import pallas_call_with_axes

__all__ = ["mpmd_map"]


def _check_pairs(meshes_and_fns) -> list[tuple[Any, Callable]]:
    if isinstance(meshes_and_fns, (str, bytes)) or not isinstance(meshes_and_fns, Sequence):
        raise TypeError(f"mpmd_map: meshes_and_fns must be a sequence of (mesh, function) "
                        f"pairs; got {type(meshes_and_fns).__name__}")
    if not meshes_and_fns:
        raise ValueError("At least one mesh/function pair is required")
    pairs = []
    for i, pair in enumerate(meshes_and_fns):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not callable(pair[1]):
            raise TypeError(f"mpmd_map: meshes_and_fns[{i}] must be a (mesh, function) "
                            f"pair; got {pair!r}")
        mesh_axes(pair[0])  # a clear error for something that is not a mesh
        pairs.append((pair[0], pair[1]))
    return pairs


def mpmd_map(meshes_and_fns: Sequence[tuple[Any, Callable[..., None]]], /,
             out_types: Any = (), *, scratch_types: Any = (), compiler_params: Any = None,
             interpret: Any = False, debug: bool = False, cost_estimate: Any = None,
             name: str | None = None,
             metadata: dict[str, str] | None = None) -> Callable[..., Any]:
    """Like ``pl.kernel``, but each (mesh, function) pair runs its own program.

    Every function is called as ``fn(*in_refs, *out_refs, *scratch_refs)`` (the output
    refs in the structure of ``out_types``) and must return None.
    """
    pairs = _check_pairs(meshes_and_fns)
    common = dict(scratch_types=scratch_types, compiler_params=compiler_params,
                  cost_estimate=cost_estimate, debug=debug, name=name, metadata=metadata)
    if len(pairs) == 1:
        [(mesh, fn)] = pairs
        return kernel(fn, out_types, mesh=mesh, interpret=interpret, **common)

    def run(*args):
        mode = resolve_interpret(interpret)
        if not mode:
            used = sorted({str(mesh_backend(m)) for m, _ in pairs})
            raise NotImplementedError(
                f"mpmd_map over {len(pairs)} meshes is run only by the interpreter "
                f"(interpret=True): no installed backend ({', '.join(used)}) lowers "
                f"several programs into one kernel yet. A single (mesh, function) pair "
                f"lowers like pl.kernel.")
        outs = kernel(pairs[0][1], out_types, mesh=pairs[0][0], interpret=mode,
                      **common)(*args)
        for mesh, fn in pairs[1:]:
            outs = _then(fn, mesh, args, outs, out_types, mode, common)
        return outs

    return run


def _then(fn, mesh, args, prev, out_types, mode, common):
    """Runs ``fn`` on ``mesh`` with the outputs starting as ``prev`` (aliased)."""
    names, sizes = mesh_axes(mesh)
    n_args = len(args)
    n_flat = len(jax.tree_util.tree_leaves(args))
    n_out = len(jax.tree_util.tree_leaves(prev))

    def body(*refs):
        fn(*refs[:n_args], *refs[n_args + 1:])

    space = getattr(mesh, "default_memory_space", MemorySpace.ANY)
    spec = bs.BlockSpec(memory_space=space)
    operands = (*args, prev)
    scratch = common["scratch_types"]
    if isinstance(scratch, Mapping):
        raise NotImplementedError("mpmd_map with a mapping of scratch_types")
    return pallas_call_with_axes(
        body, out_types, grid=sizes, grid_names=names,
        in_specs=jax.tree_util.tree_map(lambda _: spec, operands),
        out_specs=jax.tree_util.tree_map(lambda _: spec, out_types),
        scratch_shapes=tuple(scratch), interpret=mode,
        input_output_aliases={n_flat + j: j for j in range(n_out)},
        compiler_params=common["compiler_params"], debug=common["debug"],
        name=common["name"] or getattr(fn, "__name__", "mpmd_map"),
        metadata=common["metadata"], cost_estimate=common["cost_estimate"], mesh=mesh,
    )(*operands)
