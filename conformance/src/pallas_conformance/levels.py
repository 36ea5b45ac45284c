"""Running one case at one level, for one backend.

Levels, in order:

``interpret``
    The case on the core interpreter (``pallas_call(..., interpret=True)``) against its
    plain-JAX reference. Its claims are :func:`interpreter_claims`.
``lower``
    ``jax.jit(f).trace(*args).lower(lowering_platforms=backend.platforms[:1])`` and
    ``jax.export`` for that platform succeed, with ``pallas_call(..., backend=NAME)``,
    and the exported artifact survives ``serialize``/``deserialize``.
``compile``
    Every ``pallas_call`` equation of the traced case is handed to
    ``backend.compile(request)`` (a ``pallas.plugins.KernelRequest`` whose ``options``
    are the runner's ``compile_options``, e.g. ``{"chip": "v6e"}`` from the CLI's
    ``--chip``) and must not raise. What the artifacts say they were compiled for (their
    ``target``) is recorded in the report.
``backend_interpret``
    Like ``emulate`` but through ``backend.interpret(...)``: the kernel jaxpr under the
    backend's own interpret rules (e.g. TPU interpret mode). It checks the backend's
    semantics of the primitives, not the code the backend generates.
``emulate``
    The **generated code** is executed: the traced case is evaluated with every
    ``pallas_call`` equation replaced by ``backend.emulate(request, *args)``; the
    results are compared with the interpreter's.
``execute``
    ``jax.jit(f)(*args)`` on a device of the backend's platform, compared with the
    interpreter's results. Skipped when the machine has no such device.

Statuses: ``pass``, ``fail``, ``unsupported`` (the backend does not claim every tag of
the case, does not provide the level, or raises ``pallas.plugins.LevelUnsupportedError``
for this kernel at this level) and ``skipped`` (the machine cannot reach the
level).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
import traceback
from typing import Any

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np

import pallas as pl
import pallas.plugins
from pallas.plugins import KernelRequest, pallas_call_eqns, primitive_names
from pallas_conformance._jax_compat import is_known_platform
from pallas_conformance.registry import TAG_ALIASES, TAGS, Case

LEVELS = ("interpret", "lower", "compile", "backend_interpret", "emulate", "execute")
BACKEND_LEVELS = LEVELS[1:]

_CUSTOM_CALL = re.compile(r"custom_call @([\w$.\-]+)")

PASS, FAIL, UNSUPPORTED, SKIPPED = "pass", "fail", "unsupported", "skipped"
STATUSES = (PASS, FAIL, UNSUPPORTED, SKIPPED)

# The tags on which the core interpreter (``interpret=True`` and the builtin
# ``interpret`` backend) passes. While that backend declares ``capabilities={"*"}``, the
# suite reads its "*" as this set (see :func:`claimed_tags`); once it declares an explicit
# set, that set is used instead (see :func:`interpreter_claims`). Today that is every tag
# (vmap and grad pass since pallas-core's batching and JVP rules landed). A new tag that
# the interpreter cannot pass yet must be left out here, so that the interpret level
# reports its cases ``unsupported`` instead of a pass that did not happen.
INTERPRET_CAPABILITIES: frozenset[str] = frozenset(TAGS)


@dataclasses.dataclass
class Result:
    """The outcome of one case at one level."""

    case: str
    level: str
    status: str
    detail: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class Mismatch(AssertionError):
    """The numbers (or shapes, or dtypes) differ from what was expected."""


class Unreachable(Exception):
    """The level cannot reach the case's kernels (reported ``skipped``, not failed)."""


# ------------------------------------------------------------------------------------
# Claims.


def claimed_tags(backend) -> frozenset[str]:
    """The capability tags ``backend`` claims; ``"*"`` means every tag.

    Claimed tags the catalogue does not know are ignored; the aliases of
    :data:`~pallas_conformance.registry.TAG_ALIASES` (``"matmul"`` for ``"dot"``) count.

    ``backend`` is a :class:`pallas.plugins.Backend` or the string ``"interpret"`` (the
    core interpreter level). For the builtin ``interpret`` backend a ``"*"`` claim is
    read as :data:`INTERPRET_CAPABILITIES`, so the suite never reports a pass for a
    transformation the core cannot do yet.
    """
    if isinstance(backend, str) or backend is None:
        return interpreter_claims()
    caps = frozenset(TAG_ALIASES.get(t, t) for t in backend.capabilities)
    if "*" in caps:
        if backend.name == "interpret":
            return INTERPRET_CAPABILITIES
        return frozenset(TAGS)
    return caps


def interpreter_claims() -> frozenset[str]:
    """The tags the core interpreter claims: the builtin ``interpret`` backend's
    ``capabilities`` when they are explicit, :data:`INTERPRET_CAPABILITIES` when they are
    ``"*"`` (or the backend is not registered)."""
    try:
        b = pallas.plugins.get_backend("interpret")
    except pallas.plugins.BackendNotFoundError:
        return INTERPRET_CAPABILITIES
    return claimed_tags(b)


def unclaimed(case: Case, claims: frozenset[str]) -> list[str]:
    return sorted(set(case.tags) - set(claims))


# ------------------------------------------------------------------------------------
# Comparison.


def _leaves(x):
    return jax.tree_util.tree_leaves(x)


def compare(case: Case, got: Any, want: Any, what: str = "reference") -> None:
    """Raises :class:`Mismatch` unless ``got`` matches ``want`` in structure, shapes,
    dtypes and values (within the case's tolerance for the expected dtype)."""
    gs, ws = jax.tree_util.tree_structure(got), jax.tree_util.tree_structure(want)
    if gs != ws:
        raise Mismatch(f"output structure {gs} differs from the {what}'s {ws}")
    for i, (g, w) in enumerate(zip(_leaves(got), _leaves(want))):
        g, w = jnp.asarray(g), jnp.asarray(w)
        where = f"output {i}" if len(_leaves(want)) > 1 else "output"
        if g.shape != w.shape:
            raise Mismatch(f"{where}: shape {g.shape} differs from the {what}'s {w.shape}")
        if g.dtype != w.dtype:
            raise Mismatch(f"{where}: dtype {g.dtype} differs from the {what}'s {w.dtype}")
        atol, rtol = case.tolerance_for(w.dtype)
        gn = np.asarray(g.astype(jnp.float32) if g.dtype == jnp.bfloat16 else g)
        wn = np.asarray(w.astype(jnp.float32) if w.dtype == jnp.bfloat16 else w)
        if atol == 0 and rtol == 0:
            bad = ~((gn == wn) | (_isnan(gn) & _isnan(wn)))
        else:
            gf, wf = gn.astype(np.float64), wn.astype(np.float64)
            bad = ~(np.isclose(gf, wf, atol=atol, rtol=rtol, equal_nan=True))
        if bad.any():
            idx = tuple(int(j) for j in np.argwhere(bad)[0])
            n = int(bad.sum())
            raise Mismatch(
                f"{where}: {n} of {bad.size} elements differ from the {what} "
                f"(atol={atol}, rtol={rtol}); first at {idx}: got {gn[idx].item()!r}, "
                f"expected {wn[idx].item()!r}"
            )


def _isnan(a):
    return np.isnan(a) if np.issubdtype(a.dtype, np.floating) else np.zeros(a.shape, bool)


# ------------------------------------------------------------------------------------
# Binding a case to a mode.


def bound(case: Case, **pallas_call_kw):
    """``f(*args)``: the case with ``pallas_call`` bound to ``pallas_call_kw``."""
    call = functools.partial(pl.pallas_call, **pallas_call_kw)

    def f(*args):
        return case.fn(call, *args)

    f.__name__ = case.name.replace("/", "_")
    return f


def _block(x):
    return jax.tree_util.tree_map(lambda a: a.block_until_ready() if hasattr(
        a, "block_until_ready") else a, x)


def _run_interpreter(case: Case, args):
    return _block(jax.jit(bound(case, interpret=True))(*args))


def _reference(case: Case, args):
    return _block(case.reference(*args))


# ------------------------------------------------------------------------------------
# pallas_call equations.


def _eval_with_emulator(jaxpr, consts, args, emulate):
    """Evaluates a jaxpr, running each ``pallas_call`` equation through ``emulate``.

    ``pallas_call`` equations nested in ``jit``/``closed_call`` equations are reached by
    recursion; other higher-order primitives are run as they are only when they hold no
    ``pallas_call``.
    """

    def eval_eqn(eqn, invals):
        if eqn.primitive is pl.pallas_call_p:
            return emulate(eqn, invals)
        if pallas_call_eqns_in_params(eqn):
            sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
            if sub is None or eqn.primitive.name not in ("pjit", "jit", "closed_call",
                                                         "core_call"):
                raise Unreachable(
                    f"the emulate level cannot reach a pallas_call nested in "
                    f"{eqn.primitive.name}")
            closed = sub if hasattr(sub, "consts") else None
            inner = closed.jaxpr if closed is not None else sub
            return _eval_with_emulator(inner, closed.consts if closed else [], invals, emulate)
        # As jax.core.eval_jaxpr does (JAX 0.10: get_bind_params returns the params).
        bind_params = eqn.primitive.get_bind_params(eqn.params)
        ctx = getattr(getattr(eqn, "ctx", None), "manager", None)
        if ctx is None:
            outs = eqn.primitive.bind(*invals, **bind_params)
        else:
            with ctx:
                outs = eqn.primitive.bind(*invals, **bind_params)
        return outs if eqn.primitive.multiple_results else [outs]

    return pallas.plugins.walk_jaxpr(jaxpr, consts, args, eval_eqn)


def pallas_call_eqns_in_params(eqn) -> bool:
    return any(pallas_call_eqns(sub) for sub in jex.jaxprs_in_params(eqn.params))


# ------------------------------------------------------------------------------------
# Platform reachability.


@functools.cache
def can_lower_for(platform: str) -> str | None:
    """``None`` when JAX can lower for ``platform`` here, else the reason it cannot."""
    if not is_known_platform(platform):
        return (f"JAX does not know platform {platform!r} on this machine (lowering for "
                f"cuda/rocm needs the matching jax plugin, e.g. jax-cuda13-plugin)")
    try:
        jax.jit(lambda x: x + 1).trace(jnp.float32(1)).lower(lowering_platforms=(platform,))
    except Exception as e:  # noqa: BLE001 - the reason is reported
        return f"JAX cannot lower for platform {platform!r} on this machine: {e}"
    return None


@functools.cache
def has_device(platform: str) -> bool:
    try:
        return bool(jax.devices(platform))
    except Exception:  # noqa: BLE001 - no such platform here
        return False


# ------------------------------------------------------------------------------------
# The levels.


class CaseRunner:
    """Runs the cases of one backend at each level, caching inputs, the reference and
    the interpreter's results (which the backend levels are compared with)."""

    def __init__(self, backend=None, platform: str | None = None, target: str | None = None,
                 compile_options: dict | None = None):
        """``backend``: a :class:`pallas.plugins.Backend`, or ``None`` for the interpreter
        level only. ``platform``: which of the backend's platforms the levels are for
        (default: its first); ``target``: a device the backend knows for that platform
        (``"gfx942"``; default: the backend's), set with ``Backend.targeting`` while
        lowering and passed to ``compile``/``emulate`` as options ``platform``/``target``.
        ``compile_options``: more options of the compile level's requests (e.g.
        ``{"chip": "v6e"}`` for the TPU backends, from the CLI's ``--chip``).
        """
        self.backend = backend
        self.platform = platform or (backend.platforms[0] if backend and backend.platforms
                                     else "cpu")
        self.target = target
        self.compile_options = dict(compile_options or {})
        # What the compile level's artifacts were compiled for (their ``target``).
        self.compile_targets: set[str] = set()
        if backend is not None:
            with backend.targeting(self.platform, target):  # checks both
                pass
        self._args: dict[str, tuple] = {}
        self._interp: dict[str, Any] = {}

    # -- public

    def levels(self) -> tuple[str, ...]:
        """The levels run by default: ``interpret``, then each level the backend provides
        (in the order of :data:`LEVELS`)."""
        if self.backend is None:
            return ("interpret",)
        return ("interpret",) + tuple(lv for lv in BACKEND_LEVELS if lv in self.backend.levels)

    def run(self, case: Case, level: str) -> Result:
        t0 = time.perf_counter()
        try:
            status, detail = self._run(case, level)
        except (Unreachable, pallas.plugins.LevelUnreachableError) as e:
            # The machine cannot reach the level (e.g. the backend's compiler is not
            # installed; the message says what to install).
            status, detail = SKIPPED, str(e)
        except pallas.plugins.LevelUnsupportedError as e:
            # The backend cannot take this kernel at this level (say, an op its emulator
            # does not execute): not a pass, and not wrong numbers either.
            status, detail = UNSUPPORTED, _describe(e)
        except Exception as e:  # noqa: BLE001 - every failure is reported, not raised
            status, detail = FAIL, _describe(e)
        return Result(case.name, level, status, detail, time.perf_counter() - t0)

    # -- internals

    def args(self, case: Case) -> tuple:
        if case.name not in self._args:
            self._args[case.name] = case.make_inputs()
        return self._args[case.name]

    def interpreter_result(self, case: Case):
        """The interpreter's outputs, or ``None`` when the interpreter does not claim the
        case or fails on it."""
        if case.name not in self._interp:
            out = None
            if not unclaimed(case, interpreter_claims()):
                try:
                    args = self.args(case)
                    out = _run_interpreter(case, args)
                    compare(case, out, _reference(case, args))
                except Exception:  # noqa: BLE001 - reported at the interpret level
                    out = None
            self._interp[case.name] = out
        return self._interp[case.name]

    def _expected(self, case: Case, args):
        """What a backend's results are compared with: the interpreter, or the
        reference when the interpreter cannot run the case."""
        interp = self.interpreter_result(case)
        if interp is not None:
            return interp, "interpreter"
        return _reference(case, args), "reference"

    def _run(self, case: Case, level: str) -> tuple[str, str]:
        b = self.backend
        if b is None:
            return self._run_levels(None, case, level)
        # Every level, the interpreter's too, under the backend's target: a case's inputs
        # and kernels may depend on it (e.g. lanes per vector of a SparseCore chip).
        with b.targeting(self.platform, self.target):
            return self._run_levels(b, case, level)

    def _run_levels(self, b, case: Case, level: str) -> tuple[str, str]:
        if level == "interpret":
            missing = unclaimed(case, interpreter_claims())
            if missing:
                return UNSUPPORTED, f"the interpreter does not claim {', '.join(missing)}"
            args = self.args(case)
            out = _run_interpreter(case, args)
            self._interp[case.name] = None
            compare(case, out, _reference(case, args))
            self._interp[case.name] = out
            return PASS, ""
        if b is None:
            raise ValueError(f"level {level!r} needs a backend")
        if level not in b.levels:
            return UNSUPPORTED, f"backend {b.name!r} does not provide level {level!r}"
        missing = unclaimed(case, claimed_tags(b))
        if missing:
            return UNSUPPORTED, f"{b.name} does not claim {', '.join(missing)}"
        return self._run_backend(b, case, level)

    def _request(self, b, eqn, **extra) -> KernelRequest:
        """What backend ``b`` receives for one ``pallas_call`` equation (its compiler
        params coerced by the core, as for every stage)."""
        options = {"platform": self.platform}
        if self.target is not None:
            options["target"] = self.target
        return KernelRequest.for_backend(b, eqn.params, **options, **extra)

    def _run_backend(self, b, case: Case, level: str) -> tuple[str, str]:
        platform = self.platform
        args = self.args(case)
        f = bound(case, backend=b.name)
        if level == "lower":
            reason = can_lower_for(platform)
            if reason:
                return SKIPPED, reason
            lowered = jax.jit(f).trace(*args).lower(lowering_platforms=(platform,))
            text = lowered.as_text()
            # jax.export refuses custom calls without a compatibility guarantee (e.g.
            # Triton's); that is a promise about serialised artifacts, not about
            # well-formedness, so it is waived for the kernel's own custom calls. The
            # ``export`` tag's cases export without the waiver.
            targets = sorted(set(_CUSTOM_CALL.findall(text)))
            checks = [jax.export.DisabledSafetyCheck.custom_call(t) for t in targets]
            try:
                exp = jax.export.export(jax.jit(f), platforms=[platform],
                                        disabled_checks=checks)(*args)
                # The artifact must survive serialisation (what a bundle ships): e.g.
                # an effect type of a backend that escapes the kernel cannot.
                jax.export.deserialize(exp.serialize())
            except NotImplementedError as e:
                # The core interpreter checks SparseCore gather/scatter/DMA indices at run
                # time through a host callback, which jax.export cannot serialise: a limit
                # of JAX, reported as such (never a pass) for the interpret backend only.
                if b.name != "interpret" or "host_callbacks" not in str(e):
                    raise
                return SKIPPED, ("lowered; jax.export cannot serialise the host callback "
                                 "of the interpreter's runtime index checks")
            return PASS, ""
        if level == "compile":
            closed = jax.make_jaxpr(f)(*args)
            eqns = pallas_call_eqns(closed)
            if not eqns:
                return _no_pallas_call(closed, level)
            for eqn in eqns:
                try:
                    artifact = b.compile(self._request(b, eqn, **self.compile_options))
                except Exception as e:  # a rejection may name its target too
                    if isinstance(getattr(e, "target", None), str):
                        self.compile_targets.add(e.target)
                    raise
                target = getattr(artifact, "target", None)
                if isinstance(target, str):
                    self.compile_targets.add(target)
            return PASS, ""
        if level in ("emulate", "backend_interpret"):
            closed = jax.make_jaxpr(f)(*args)
            if not pallas_call_eqns(closed):
                return _no_pallas_call(closed, level)
            run_kernel = b.emulate if level == "emulate" else b.interpret

            def emulate(eqn, invals):
                outs = run_kernel(self._request(b, eqn), *invals)
                outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
                if len(outs) != len(eqn.outvars):
                    raise Mismatch(f"emulate returned {len(outs)} outputs for a pallas_call "
                                   f"with {len(eqn.outvars)}")
                return outs

            flat_args = jax.tree_util.tree_leaves(args)
            flat_out = _eval_with_emulator(closed.jaxpr, closed.consts, flat_args, emulate)
            out_tree = jax.tree_util.tree_structure(jax.eval_shape(f, *args))
            got = jax.tree_util.tree_unflatten(out_tree, flat_out)
            want, what = self._expected(case, args)
            compare(case, _block(got), want, what)
            return PASS, ""
        if level == "execute":
            if not has_device(platform):
                return SKIPPED, f"no {platform} device on this machine"
            got = _block(jax.jit(f)(*args))
            want, what = self._expected(case, args)
            compare(case, got, want, what)
            return PASS, ""
        raise ValueError(f"unknown level {level!r}; expected one of {LEVELS}")


def _no_pallas_call(closed, level) -> tuple[str, str]:
    """A case whose kernels are sealed in a ``jax.export`` artifact: the compile and
    emulate levels cannot see them (``lower`` and ``execute`` still run them)."""
    if "call_exported" in primitive_names(closed):
        return SKIPPED, (f"the case's pallas_call is inside a jax.export artifact, which "
                         f"the {level} level cannot reach")
    raise AssertionError("the traced case has no pallas_call equation")


def _describe(e: BaseException) -> str:
    if isinstance(e, Mismatch):
        return str(e)
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {tb[-1].filename.split('/')[-1]}:{tb[-1].lineno})" if tb else ""
    msg = str(e).strip().split("\n")[0][:500]
    return f"{type(e).__name__}: {msg}{where}"
