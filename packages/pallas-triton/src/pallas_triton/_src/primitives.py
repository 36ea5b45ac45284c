"""The Triton backend's own primitives: ``debug_barrier`` and inline assembly.

Atomics are pallas-core's (``pallas.atomics``); ``pltriton.atomic_*`` re-export them.

Each primitive is defined here with its abstract evaluation and its interpreter rule
(so kernels using it still run with ``interpret=True``); its Triton lowering is in
:mod:`.lowering`, under the same primitive name.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from pallas import plugins

# -- debug_barrier ------------------------------------------------------------------------

debug_barrier_p = plugins.effect_primitive("debug_barrier", {plugins.kernel_debug_effect})


def debug_barrier() -> None:
    """Synchronises the threads of a program (``tl.debug_barrier``)."""
    debug_barrier_p.bind()


def _debug_barrier_rule(ctx, eqn, invals):
    return []


# -- inline assembly --------------------------------------------------------------------

elementwise_inline_asm_p = jax.extend.core.Primitive("triton_elementwise_inline_asm")
elementwise_inline_asm_p.multiple_results = True


def elementwise_inline_asm(asm: str, *, args: Sequence[jax.Array], constraints: str,
                           pack: int,
                           result_shape_dtypes: Sequence[jax.ShapeDtypeStruct]
                           ) -> Sequence[jax.Array]:
    """Inline PTX applied elementwise (``tl.inline_asm_elementwise``)."""
    return elementwise_inline_asm_p.bind(
        *args, asm=asm, constraints=constraints, pack=pack,
        result_shape_dtypes=tuple(jax.ShapeDtypeStruct(r.shape, r.dtype)
                                  for r in result_shape_dtypes))


elementwise_inline_asm_p.def_abstract_eval(
    lambda *avals, asm, constraints, pack, result_shape_dtypes: [
        jax.core.ShapedArray(r.shape, r.dtype) for r in result_shape_dtypes])


def _inline_asm_rule(ctx, eqn, invals):
    raise NotImplementedError(
        "pltriton.elementwise_inline_asm runs only on a GPU: the interpreter cannot "
        "execute PTX. Write the operation with jax.numpy for interpret=True.")


INTERPRET_RULES = {
    debug_barrier_p: _debug_barrier_rule,
    elementwise_inline_asm_p: _inline_asm_rule,
}
for _prim, _rule in INTERPRET_RULES.items():
    plugins.register_interpret_rule(_prim)(_rule)
