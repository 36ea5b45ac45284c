"""``input_output_aliases``: an aliased output is the same GMEM buffer as its input.

As upstream's Mosaic GPU Pallas does, the kernel itself is unchanged (it reads its
inputs and writes its outputs through separate pointers); the ``mosaic_gpu_v2`` custom
call asks XLA to alias the buffers, so the output starts as the input and what the
kernel does not write keeps the input's values. Mosaic GPU's ``mosaic_gpu_p`` takes no
aliases, so aliased kernels bind ``mosaic_gpu_aliased_p``, which lowers to the same
custom call with them.
"""

from __future__ import annotations

import jax

from pallas_mosaic_gpu._src import jax_compat as jc

mosaic_gpu_aliased_p = jc.Primitive("mosaic_gpu_aliased")
mosaic_gpu_aliased_p.multiple_results = True


@mosaic_gpu_aliased_p.def_abstract_eval
def _abstract_eval(*_, module, out_types, input_output_aliases):
    del module, input_output_aliases
    return [jc.ShapedArray(t.shape, t.dtype) for t in out_types]


def _lowering(ctx, *args, module, out_types, input_output_aliases):
    return jc.mosaic_gpu_custom_call(ctx, *args, module=module, out_types=out_types,
                                     input_output_aliases=input_output_aliases)


jc.mlir.register_lowering(mosaic_gpu_aliased_p, _lowering, "cuda")


def module_of_fn(fn, in_shapes):
    """The MLIR module that a kernel function (binding Mosaic GPU's custom call) carries."""
    import jax.extend.core as jex

    def find(jaxpr):
        for e in jaxpr.eqns:
            if "module" in e.params and e.primitive.name.startswith("mosaic_gpu"):
                return e.params["module"]
            for sub in jex.jaxprs_in_params(e.params):
                found = find(sub)
                if found is not None:
                    return found
        return None

    module = find(jax.make_jaxpr(fn)(*in_shapes).jaxpr)
    if module is None:
        raise RuntimeError("the kernel function binds no Mosaic GPU custom call")
    return module


def aliased_fn(fn, in_shapes, out_shapes, inout_shapes, aliases):
    """``fn`` (from ``mgpu.as_gpu_kernel``, taking ``in_shapes`` then ``inout_shapes``)
    rebound so that output ``o`` aliases input ``i`` for each ``(i, o)`` of
    ``aliases``; the ``inout`` buffers (the semaphores) stay aliased to themselves."""
    module = module_of_fn(fn, (*in_shapes, *inout_shapes))
    pairs = tuple((int(i), int(o)) for i, o in aliases)
    pairs += tuple((len(in_shapes) + j, len(out_shapes) + j)
                   for j in range(len(inout_shapes)))
    out_types = (*out_shapes, *inout_shapes)

    @jax.jit
    def kernel(*args):
        return mosaic_gpu_aliased_p.bind(*args, module=module, out_types=out_types,
                                         input_output_aliases=pairs)

    return kernel
