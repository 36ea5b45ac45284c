"""Per-core kernel state that a backend declares (e.g. pallas-tpu's hardware PRNG).

A core may hold state that no ref names: a PRNG's seed and draw counter. Its rules must
not keep it in Python, because the interpreter traces loop bodies, branches and the grid
loop once: a backend declares the state here (a fixed-shape array and the primitives
that use it) and the interpreter holds it in a :class:`Cell` that it threads through
control flow and carries from grid step to grid step, as it does scratch. Rules reach
the cell with :meth:`KernelContext.kernel_state`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import jax

from pallas._src import jax_compat as jc
from pallas._src.jaxpr_util import contains, eqn_sub_jaxprs


@dataclasses.dataclass(frozen=True)
class KernelState:
    """One declared piece of per-core state. ``init()`` is its value when a kernel starts;
    ``reads`` are the primitives whose result depends on it, ``resets`` those that set it
    whole (a step that resets it before any read does not see the previous step's)."""

    name: str
    init: Callable[[], jax.Array]
    reads: frozenset
    resets: frozenset

    @property
    def primitives(self) -> frozenset:
        return self.reads | self.resets


kernel_states: dict[str, KernelState] = {}

# The rules of JAX's key primitives evaluate a key implementation's functions through the
# interpreter (``interpreter/prng.py``); a backend's implementation may use its state.
_KEY_PRIMS = (jc.random_bits_p, jc.random_seed_p, jc.random_fold_in_p, jc.random_split_p)


def declare_kernel_state(name: str, init: Callable[[], jax.Array], *,
                         reads: Iterable = (), resets: Iterable = ()) -> KernelState:
    """Declares per-core kernel state ``name`` (see the module docstring). Declaring the
    same name again replaces the declaration."""
    state = KernelState(name, init, frozenset(reads), frozenset(resets))
    kernel_states[name] = state
    return state


def states_used_by(jaxpr) -> list[KernelState]:
    """The declared states that the kernel ``jaxpr`` may use (at any depth)."""
    used = []
    for state in kernel_states.values():
        prims = state.primitives.union(_KEY_PRIMS)
        if contains(jaxpr, lambda eqn, prims=prims: eqn.primitive in prims):
            used.append(state)
    return used


def live_in(jaxpr, states: Iterable[KernelState]) -> bool:
    """Whether a grid step of ``jaxpr`` may read a state that an earlier step left: some
    read comes (at any depth) before the first unconditional reset."""
    for state in states:
        for eqn in jaxpr.eqns:
            if eqn.primitive in state.resets:
                break
            if eqn.primitive in state.reads or any(
                    contains(sub, lambda e, r=state.reads: e.primitive in r)
                    for sub in eqn_sub_jaxprs(eqn)):
                return True
    return False
