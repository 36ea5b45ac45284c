"""Evaluates a kernel jaxpr on values, with refs held in mutable cells.

The evaluator runs while an enclosing JAX trace is active (the interpreter's grid loop
is itself traced and compiled by XLA), so every value it handles may be a tracer. Refs
become :class:`Cell` objects; control flow that touches refs is re-bound through the
``lax`` API with the cells' contents threaded through as explicit carries. This is how
``program_id``, semaphores, DMAs and the opt-in checks get their meaning, including
inside ``cond``, ``while`` and ``scan`` bodies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from pallas._src import jax_compat as jc
from pallas._src.interpreter import predication, views
from pallas._src.interpreter.kernel_state import kernel_states
from pallas._src.interpreter.rules import interpret_rules, register_interpret_rule
from pallas._src.jaxpr_util import remote_operations, walk_jaxpr


class Cell:
    """The current contents of one ref during interpretation.

    ``init`` is a boolean mask of written elements, kept only when the uninitialised-
    read check is on. ``origin`` names the operand (e.g. ``outputs[0]``) for errors.
    Assigning ``value`` or ``init`` is a write of the kernel: inside a predicated branch
    (see ``predication``) it takes effect only where the branch is taken.
    """

    __slots__ = ("_value", "_init", "origin", "memory_space", "block")

    def __init__(self, value, origin: str = "a ref", init=None, memory_space=None,
                 block=None):
        self._value = value
        self._init = init
        self.origin = origin
        self.memory_space = memory_space
        self.block = block  # the block index this cell holds, for error messages

    value = predication.Written()
    init = predication.Written()

    def state(self) -> tuple:
        return (self.value,) if self.init is None else (self.value, self.init)

    def set_state(self, state: Sequence[Any]) -> None:
        """Takes contents a sub-trace computed (already masked where it was a write)."""
        self._value = state[0]
        if self._init is not None:
            self._init = state[1]

    def fork(self, state: Sequence[Any]) -> Cell:
        """A cell with the same identity data but contents ``state`` (for sub-traces)."""
        c = Cell(state[0], self.origin, None, self.memory_space, self.block)
        if self.init is not None:
            c.init = state[1]
        return c

    def accumulate(self, add) -> None:
        """Applies a write that hardware performs as an atomic accumulate (a DMA with
        ``add=True``): ``add`` maps the old contents to the new by adding. Cells that
        model concurrent writers (the SparseCore subcores' views of shared memory)
        override it to sum every writer's contributions instead of keeping one."""
        self.value = add(self.value)

    def __repr__(self) -> str:
        return f"Cell({self.origin}: {jax.typeof(self.value).str_short()})"


@dataclasses.dataclass
class ErrorTable:
    """Static messages of checks; runtime state is an int32 vector ``[code, *payload]``."""

    messages: list = dataclasses.field(default_factory=list)
    payload_size: int = 8

    def code_for(self, message: str) -> int:
        self.messages.append(message)
        return len(self.messages)


class KernelContext:
    """What a kernel evaluation needs beyond its operands.

    ``grid_indices`` are the current program ids (int32 scalars, possibly traced),
    ``grid`` the grid sizes (traced int32 scalars where the grid is dynamic). ``error`` is a cell holding the first failed
    check (``None`` when no checks are on). ``states`` holds the cells of declared
    per-core kernel state (see ``kernel_state``), by name.
    """

    def __init__(self, grid_indices, grid, *, errors: ErrorTable | None = None,
                 error_cell: Cell | None = None, check_uninitialized: bool = False,
                 debug_checks: bool = False, axis_names: tuple | None = None,
                 backend_state: dict | None = None):
        self.grid_indices = tuple(grid_indices)
        self.grid = tuple(grid)
        self.errors = errors
        self.error_cell = error_cell
        self.check_uninitialized = check_uninitialized
        self.debug_checks = debug_checks
        self.axis_names = axis_names
        self.backend_state = backend_state if backend_state is not None else {}
        self.states: dict[str, Cell] = {}

    def kernel_state(self, name: str) -> Cell:
        """The cell of the declared kernel state ``name``. A runner that traces the kernel
        creates it before the body (so control flow threads it); otherwise it starts
        here, at its initial value, and lives as long as this context."""
        cell = self.states.get(name)
        if cell is None:
            decl = kernel_states.get(name)
            if decl is None:
                raise KeyError(f"no kernel state {name!r} is declared; declared: "
                               f"{sorted(kernel_states)}")
            cell = self.states[name] = Cell(decl.init(), f"the kernel state {name!r}")
        return cell

    # -- checks ---------------------------------------------------------------------
    def report_read(self, ok, cell: Cell, message: str) -> None:
        """Reports a bad read of ``cell``, naming its block when it holds one."""
        if cell.block is None:
            self.report(ok, message)
        else:
            self.report(ok, message, [*self.grid_indices, len(cell.block), *cell.block])

    def report(self, ok, message: str, payload: Sequence[Any] | None = None) -> None:
        """Records ``message`` (with int payload) as the first error if ``ok`` is false."""
        if self.error_cell is None:
            return
        code = self.errors.code_for(message)
        if payload is None:
            payload = [*self.grid_indices, 0]
        payload = [jnp.asarray(p, jnp.int32).reshape(()) for p in payload]
        payload += [jnp.int32(0)] * (self.errors.payload_size - len(payload))
        new = jnp.stack([jnp.int32(code), *payload[: self.errors.payload_size]])
        cur = self.error_cell.value
        take = jnp.logical_and(cur[0] == 0, jnp.logical_not(jnp.asarray(ok)))
        self.error_cell.value = jnp.where(take, new, cur)

    def extra_cells(self) -> list[Cell]:
        """Cells that every control-flow construct must thread through (error state,
        kernel state)."""
        cells = [self.error_cell] if self.error_cell is not None else []
        return cells + list(self.states.values())


# ------------------------------------------------------------------------------------
# The evaluator.


def eval_jaxpr(ctx: KernelContext, jaxpr, consts: Sequence[Any], args: Sequence[Any]):
    """Evaluates ``jaxpr`` with ``Cell``s for refs; returns the list of outputs."""
    if len(jaxpr.invars) != len(args):
        raise TypeError(f"jaxpr takes {len(jaxpr.invars)} arguments, got {len(args)}")
    return walk_jaxpr(jaxpr, consts, args, lambda eqn, invals: eval_eqn(ctx, eqn, invals))


def eval_eqn(ctx: KernelContext, eqn, invals: list) -> list:
    """One equation: its interpreter rule, else JAX's bind on plain values."""
    rule = interpret_rules.get(eqn.primitive)
    with jc.source_info_util.user_context(eqn.source_info.traceback):
        if rule is not None:
            return rule(ctx, eqn, invals)
        if any(isinstance(x, Cell) for x in invals):
            raise NotImplementedError(
                f"The Pallas interpreter has no rule for the primitive "
                f"'{eqn.primitive.name}' applied to refs. If a backend package defines "
                f"this primitive, make sure it is installed and registered."
            )
        return bind_eqn(eqn, invals)


def bind_eqn(eqn, invals) -> list:
    """Binds ``eqn``'s primitive on ``invals`` as JAX would (the plain-value case)."""
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns = params.pop("subfuns", ())
    outs = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(outs) if eqn.primitive.multiple_results else [outs]


def eval_closed(ctx, closed_jaxpr, args):
    return eval_jaxpr(ctx, closed_jaxpr.jaxpr, closed_jaxpr.consts, args)


# ------------------------------------------------------------------------------------
# State primitives: read and write the cell's value through the ref's transforms
# (indexers, reshapes, bitcasts; see ``views``).


def _check_initialized(ctx, eqn, cell: Cell, idx) -> None:
    if not ctx.check_uninitialized or cell.init is None:
        return
    mask = views.read_mask(cell.init, jnp.result_type(cell.value), idx, eqn.params["tree"])
    ctx.report_read(jnp.all(mask), cell, f"read of uninitialised memory in {cell.origin}")


@register_interpret_rule(jc.get_p)
def _get_rule(ctx, eqn, invals):
    cell, *idx = invals
    _check_initialized(ctx, eqn, cell, idx)
    return [views.read_flat(cell.value, idx, eqn.params["tree"])]


@register_interpret_rule(jc.swap_p)
def _swap_rule(ctx, eqn, invals):
    cell, val, *idx = invals
    return [views.write_cell(cell, idx, eqn.params["tree"], val)]


@register_interpret_rule(jc.addupdate_p)
def _addupdate_rule(ctx, eqn, invals):
    cell, val, *idx = invals
    _check_initialized(ctx, eqn, cell, idx)
    cell.value = views.add_flat(cell.value, val, idx, eqn.params["tree"])
    return []


# ------------------------------------------------------------------------------------
# Control flow: rebind through lax with the touched cells threaded as carries.


def _unique_cells(*groups) -> list[Cell]:
    seen: dict[int, Cell] = {}
    for group in groups:
        for x in group:
            if isinstance(x, Cell) and id(x) not in seen:
                seen[id(x)] = x
    return list(seen.values())


class _Threaded:
    """Maps the outer cells of an equation to their contents inside a sub-trace."""

    def __init__(self, ctx: KernelContext, cells: list[Cell]):
        self.ctx = ctx
        self.cells = cells + [c for c in ctx.extra_cells() if all(c is not d for d in cells)]

    def states(self):
        return [c.state() for c in self.cells]

    def enter(self, states):
        """Forks cells from ``states``; returns (substitution, inner ctx)."""
        inner = [c.fork(s) for c, s in zip(self.cells, states)]
        subst = {id(c): n for c, n in zip(self.cells, inner)}
        sub_ctx = _copy_ctx(self.ctx, subst)
        return subst, sub_ctx, inner

    def update(self, states) -> None:
        for c, s in zip(self.cells, states):
            c.set_state(s)

    def eval(self, states, jaxpr, args) -> tuple[list, list]:
        """Evaluates the closed ``jaxpr`` on ``args`` with the cells forked from
        ``states`` (outer cells among ``args`` become their forks); returns (outputs,
        the cells' states after it), for the body of a ``lax`` control-flow function."""
        subst, sub_ctx, inner = self.enter(states)
        outs = eval_closed(sub_ctx, jaxpr, _sub(args, subst))
        return outs, [c.state() for c in inner]


def _copy_ctx(ctx: KernelContext, subst: dict) -> KernelContext:
    new = KernelContext.__new__(KernelContext)
    new.__dict__.update(ctx.__dict__)
    if ctx.error_cell is not None:
        new.error_cell = subst.get(id(ctx.error_cell), ctx.error_cell)
    # A state first used inside the sub-trace stays there (its own dict).
    new.states = {k: subst.get(id(c), c) for k, c in ctx.states.items()}
    return new


def _sub(vals, subst):
    return [subst.get(id(x), x) if isinstance(x, Cell) else x for x in vals]


@register_interpret_rule(jc.cond_p)
def _cond_rule(ctx, eqn, invals):
    index, *ops = invals
    branches = eqn.params["branches"]
    if len(branches) > 1 and any(remote_operations(b) for b in branches):
        return _predicated_cond(ctx, index, ops, branches)
    th = _Threaded(ctx, _unique_cells(ops))
    plain = [x for x in ops if not isinstance(x, Cell)]

    def make_branch(branch):
        def run(states, plain_vals):
            it = iter(plain_vals)
            return th.eval(states, branch, [x if isinstance(x, Cell) else next(it)
                                            for x in ops])

        return run

    if len(branches) == 1:
        outs, states = make_branch(branches[0])(th.states(), plain)
    else:
        index = lax.convert_element_type(index, jnp.int32)
        outs, states = lax.switch(index, [make_branch(b) for b in branches], th.states(), plain)
    th.update(states)
    return outs


def _predicated_cond(ctx, index, ops, branches) -> list:
    """A ``cond`` whose branches address other devices: every branch runs, in order, on
    every device, its writes masked to where it is the branch taken, so each device
    reaches the collectives of remote DMAs and signals at the same point (a device-
    dependent ``pl.when`` around a remote copy). The outputs are the taken branch's."""
    index = lax.clamp(0, lax.convert_element_type(index, jnp.int32), len(branches) - 1)
    outs = []
    for i, branch in enumerate(branches):
        with predication.predicated(index == i):
            outs.append(eval_closed(ctx, branch, ops))
    return [lax.select_n(index, *vals) for vals in zip(*outs)]


@register_interpret_rule(jc.while_p)
def _while_rule(ctx, eqn, invals):
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, carry = invals[:nc], invals[nc : nc + nb], invals[nc + nb :]
    th = _Threaded(ctx, _unique_cells(cconsts, bconsts))

    def cond_fun(state):
        states, c = state
        (pred,), _ = th.eval(states, p["cond_jaxpr"], [*cconsts, *c])
        return pred

    def body_fun(state):
        states, c = state
        new_c, new_states = th.eval(states, p["body_jaxpr"], [*bconsts, *c])
        return new_states, new_c

    states, out = lax.while_loop(cond_fun, body_fun, (th.states(), list(carry)))
    th.update(states)
    return out


@register_interpret_rule(jc.scan_p)
def _scan_rule(ctx, eqn, invals):
    p = eqn.params
    nconsts, ncarry = p["num_consts"], p["num_carry"]
    consts = invals[:nconsts]
    carry = invals[nconsts : nconsts + ncarry]
    xs = invals[nconsts + ncarry :]
    th = _Threaded(ctx, _unique_cells(consts))

    def body(state, x):
        states, c = state
        outs, new_states = th.eval(states, p["jaxpr"], [*consts, *c, *x])
        return (new_states, outs[:ncarry]), outs[ncarry:]

    (states, carry_out), ys = lax.scan(
        body, (th.states(), list(carry)), list(xs), length=p["length"],
        reverse=p["reverse"], unroll=p["unroll"],
    )
    th.update(states)
    return [*carry_out, *ys]


# Calls are inlined: their bodies see the same cells.


@register_interpret_rule(jc.jit_p)
def _jit_rule(ctx, eqn, invals):
    return eval_closed(ctx, eqn.params["jaxpr"], invals)


@register_interpret_rule(jc.closed_call_p)
def _closed_call_rule(ctx, eqn, invals):
    return eval_closed(ctx, eqn.params["call_jaxpr"], invals)


@register_interpret_rule(jc.remat_p)
def _remat_rule(ctx, eqn, invals):
    return eval_jaxpr(ctx, eqn.params["jaxpr"], (), invals)


@register_interpret_rule(jc.custom_jvp_call_p)
def _custom_jvp_rule(ctx, eqn, invals):
    return eval_closed(ctx, eqn.params["call_jaxpr"], invals)


@register_interpret_rule(jc.custom_vjp_call_p)
def _custom_vjp_rule(ctx, eqn, invals):
    return eval_closed(ctx, eqn.params["call_jaxpr"], invals)


# JAX's own debugging primitives given refs (``jax.debug.print("{}", x_ref)``,
# ``jax.debug.callback(f, x_ref)``) see the refs' current contents, as upstream's
# interpreter (which discharges refs to values) prints them.


def _debug_of_contents_rule(ctx, eqn, invals):
    vals = [x.value if isinstance(x, Cell) else x for x in invals]
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns = params.pop("subfuns", ())
    return list(eqn.primitive.bind(*subfuns, *vals, **params))


for _prim in (jc.jax_debug_print_p, jc.debug_callback_p):
    register_interpret_rule(_prim)(_debug_of_contents_rule)
