"""One search: prune the configs, then time the rest on the device or rank them by the model."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from pallas._src.jaxpr_walk import pallas_call_eqns
from pallas._src.tuning import figures as figs
from pallas._src.tuning import kernels, model
from pallas._src.tuning.devices import Target
from pallas._src.tuning.keys import config_json
from pallas._src.tuning.progress import Progress
from pallas._src.tuning.report import ConfigResult, TuningReport
from pallas._src.tuning.timer import Timer, median


class TuningError(ValueError):
    """No config of a search survived pruning and running; the report says why each went."""

    def __init__(self, report: TuningReport) -> None:
        super().__init__(f"autotune: no config of {report.function} can run\n{report}")
        self.report = report


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, type)


@dataclasses.dataclass
class Bound:
    """The tuned function's arguments split into arrays (traced) and the rest (static)."""

    f: Callable
    leaves: list
    tree: Any
    arrays: list

    @classmethod
    def of(cls, f: Callable, args: Sequence, kwargs: Mapping) -> Bound:
        leaves, tree = jax.tree_util.tree_flatten((tuple(args), dict(kwargs)))
        return cls(f, leaves, tree, [x for x in leaves if _is_array(x)])

    @property
    def avals(self) -> list:
        return [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in self.arrays]

    def with_config(self, config: Mapping[str, Any]) -> Callable:
        """``f`` with ``config`` applied, as a function of the array arguments only."""
        def run(*arrays):
            it = iter(arrays)
            full = [next(it) if _is_array(x) else x for x in self.leaves]
            a, k = jax.tree_util.tree_unflatten(self.tree, full)
            return self.f(*a, **k, **config)
        return run

    def pallas_calls(self, config: Mapping[str, Any]) -> list:
        """The ``pallas_call_p`` equations of ``f`` under ``config`` (raises if it does not
        trace)."""
        closed = jax.make_jaxpr(self.with_config(config))(*self.avals)
        return pallas_call_eqns(closed.jaxpr)


def _first_line(e: BaseException, limit: int = 300) -> str:
    text = str(e).strip().splitlines()
    msg = f"{type(e).__name__}: {text[0] if text else ''}"
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def _user_prunes(prune: Any) -> list[Callable]:
    if prune is None:
        return []
    if callable(prune):
        return [prune]
    return list(prune)


def examine(bound: Bound, r: ConfigResult, target: Target, prune: Any) -> None:
    """Prunes ``r`` (status and reason) or fills its figures and model estimate."""
    for p in _user_prunes(prune):
        why = p(r.config, *jax.tree_util.tree_unflatten(bound.tree, bound.leaves)[0])
        if why:
            r.status, r.reason = "pruned", (why if isinstance(why, str) else f"pruned by {p.__name__}")
            return
    try:
        eqns = bound.pallas_calls(r.config)
    except Exception as e:  # noqa: BLE001 - the reason is reported
        r.status, r.reason = "pruned", f"does not trace: {_first_line(e)}"
        return
    untiled = [s for eqn in eqns for s in kernels.untiled_blocks(eqn)]
    if untiled:
        r.status, r.reason = "pruned", "; ".join(untiled)
        return
    try:
        jax.jit(bound.with_config(r.config)).trace(*bound.avals).lower(
            lowering_platforms=(target.platform,))
    except Exception as e:  # noqa: BLE001
        r.status, r.reason = "pruned", f"does not lower for {target.platform}: {_first_line(e)}"
        return
    kfigs = [kernels.kernel_figures(eqn) for eqn in eqns]
    compiled: list[dict] = []
    for eqn in eqns:
        values: dict = {}
        if not target.measured or target.platform != "cpu":
            b = kernels.backend_of(eqn.params, target.platform)
            try:
                bf = figs.backend_figures(b, eqn.params, target) if b is not None else None
                values = bf.values if bf is not None else {}
            except Exception as e:  # noqa: BLE001
                if target.measured:  # the device will say whether it runs; keep the note
                    values = {"error": f"{b.name}'s compile figures: {_first_line(e)}"}
                else:  # without the device, the compiler is the only judge
                    r.status = "pruned"
                    r.reason = f"rejected by {b.name}'s compiler: {_first_line(e)}"
                    return
        compiled.append(values)
    problem = model.memory_problem(kfigs, compiled, target)
    if problem:
        r.status, r.reason = "pruned", problem
        return
    r.figures = [{**dataclasses.asdict(k), "compiled": c} for k, c in zip(kfigs, compiled)]
    r.estimate = model.estimate(kfigs, compiled, target)


def _time_in_rounds(bound: Bound, results: list[ConfigResult], timer: Timer, warmup: int,
                    repeats: int, bar: Progress) -> None:
    """Warms each live config up, then times one run of each per round (``repeats``
    rounds), so that load changes fall on all of them; a config that raises is failed."""
    def fail(r: ConfigResult, e: Exception) -> None:
        r.status, r.reason, r.times = "failed", f"raised while running: {_first_line(e)}", []

    calls = {}
    for r in results:
        if r.status != "ranked":
            continue
        fn = jax.jit(bound.with_config(r.config))
        call = functools.partial(lambda fn: fn(*bound.arrays), fn)
        try:
            for _ in range(warmup):
                timer.warm(call, r.config)
        except Exception as e:  # noqa: BLE001 - the reason is reported
            fail(r, e)
            continue
        calls[r.index] = call
    for _ in range(repeats):
        for r in results:
            if r.index not in calls:
                continue
            try:
                r.times.append(timer.time_once(calls[r.index], r.config))
            except Exception as e:  # noqa: BLE001
                fail(r, e)
                del calls[r.index]
                continue
            bar.step(config_json(r.config))
    for r in results:
        if r.times:
            r.median = median(r.times)


def _pick(results: list[ConfigResult], score: str) -> ConfigResult | None:
    live = [r for r in results if r.status == "ranked" and getattr(r, score) is not None]
    return min(live, key=lambda r: (getattr(r, score), r.index), default=None)


def run_search(f: Callable, configs: Sequence[dict], args: Sequence, kwargs: Mapping, *,
               target: Target, prune: Any = None, warmup: int = 1, repeats: int = 5,
               timer: Timer | None = None, name: str = "", key=None) -> TuningReport:
    """Searches ``configs`` for ``f(*args, **kwargs)``: measured on ``target`` when it is
    at hand, else ranked by the model. Raises :class:`TuningError` when none survives."""
    start = time.perf_counter()
    bound = Bound.of(f, args, kwargs)
    results = [ConfigResult(i, dict(c)) for i, c in enumerate(configs)]
    n_timed = len(results) * repeats if target.measured else 0
    bar = Progress(name, len(results) + n_timed)
    try:
        for r in results:
            examine(bound, r, target, prune)
            bar.step(config_json(r.config))
        if target.measured:
            _time_in_rounds(bound, results, timer, warmup, repeats, bar)
    finally:
        bar.close()
    best = _pick(results, "median" if target.measured else "estimate")
    report = TuningReport(name, key, "measured" if target.measured else "model",
                          best.config if best else {}, results,
                          time.perf_counter() - start, "" if target.measured else target.why)
    if best is None:
        raise TuningError(report)
    best.status = "chosen"
    if target.measured:
        ranked = [r for r in results if r.median is not None and r.estimate is not None]
        report.model_agreement = model.kendall_tau([r.estimate for r in ranked],
                                                   [r.median for r in ranked])
    return report
