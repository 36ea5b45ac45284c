"""``plgpu.kernel``: a Mosaic GPU kernel over a mesh of blocks and threads.

The body gets every operand and output as a whole GMEM ref, followed by the scratch
refs; scratch is allocated once per block and shared by the block's threads (a
``run_scoped`` collective over the thread axis), as upstream.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pallas as pl
from pallas_mosaic_gpu._src.interpret.params import InterpretParams
from pallas_mosaic_gpu._src.mesh import Mesh


class _NotSpecified:
    def __repr__(self) -> str:
        return "<not-specified>"


NOT_SPECIFIED: Any = _NotSpecified()


def kernel(body: Callable[..., None] | Any = NOT_SPECIFIED,
           out_shape: object = NOT_SPECIFIED, *, out_type: object = NOT_SPECIFIED,
           scratch_types: Any = NOT_SPECIFIED, scratch_shapes: Any = NOT_SPECIFIED,
           compiler_params: Any = None, grid: tuple[int, ...] = (),
           grid_names: tuple[str, ...] = (), cluster: tuple[int, ...] = (),
           cluster_names: tuple[str, ...] = (), num_threads: int | None = None,
           thread_name: str | None = None, interpret: Any = None, **mesh_kwargs: Any) -> Any:
    """Defines a Mosaic GPU kernel; returns a function of the input arrays (or, without
    ``body``, a decorator). ``out_type``: a pytree of ``jax.ShapeDtypeStruct``;
    ``scratch_types``: a pytree (sequence or mapping) of buffer types such as
    ``plgpu.SMEM(...)`` or ``plgpu.Barrier(...)``; ``grid``/``cluster``/``num_threads``
    and their names make the :class:`plgpu.Mesh`. ``out_shape``/``scratch_shapes`` are
    upstream's deprecated aliases. ``interpret=True`` means GPU interpret mode with
    default ``plgpu.InterpretParams()``."""
    if body is NOT_SPECIFIED:
        return lambda fun: kernel(
            fun, out_shape, out_type=out_type, scratch_types=scratch_types,
            scratch_shapes=scratch_shapes, compiler_params=compiler_params, grid=grid,
            grid_names=grid_names, cluster=cluster, cluster_names=cluster_names,
            num_threads=num_threads, thread_name=thread_name, interpret=interpret,
            **mesh_kwargs)
    if out_shape is not NOT_SPECIFIED or scratch_shapes is not NOT_SPECIFIED:
        warnings.warn("The out_shape and scratch_shapes arguments to plgpu.kernel are "
                      "deprecated. Use out_type and scratch_types instead.",
                      DeprecationWarning, stacklevel=2)
    if out_shape is not NOT_SPECIFIED:
        if out_type is not NOT_SPECIFIED:
            raise ValueError("Cannot specify both out_shape and out_type. Use out_type.")
        out_type = out_shape
    elif out_type is NOT_SPECIFIED:
        out_type = ()
    if scratch_shapes is not NOT_SPECIFIED:
        if scratch_types is not NOT_SPECIFIED:
            raise ValueError("Cannot specify both scratch_shapes and scratch_types. Use "
                             "scratch_types.")
        scratch_types = scratch_shapes
    elif scratch_types is NOT_SPECIFIED:
        scratch_types = ()
    unwrap = not isinstance(out_type, (tuple, list))
    out_types = (out_type,) if unwrap else tuple(out_type)
    mesh = Mesh(grid=grid, grid_names=grid_names, cluster=cluster,
                cluster_names=cluster_names, num_threads=num_threads,
                thread_name=thread_name, **mesh_kwargs)
    name = mesh.kernel_name or getattr(body, "__name__", "anonymous")

    def kernel_body(*refs):
        pos = scratch_types if isinstance(scratch_types, Sequence) else ()
        kw = scratch_types if isinstance(scratch_types, Mapping) else {}
        pl.run_scoped(functools.partial(body, *refs), *pos,
                      collective_axes=mesh.thread_name if mesh.thread_name is not None
                      else (), **kw)

    if interpret is True:
        # The threads of a block may wait for each other (barriers), which the reference
        # interpreter, running them one after another, cannot do: GPU interpret mode.
        interpret = InterpretParams()

    def run(*operands):
        outs = pl.kernel(kernel_body, out_types, mesh=mesh, compiler_params=compiler_params,
                         interpret=interpret if interpret is not None else False,
                         name=name)(*operands)
        return outs[0] if unwrap else outs

    return functools.wraps(body)(run) if callable(body) else run

