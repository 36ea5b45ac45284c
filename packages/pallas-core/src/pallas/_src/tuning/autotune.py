"""``autotune`` and ``tune``: choose a config by search, remember it, reuse it under ``jit``."""

from __future__ import annotations

import functools
import os
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from pallas._src.tuning import kernels
from pallas._src.tuning.cache import TuningCache
from pallas._src.tuning.devices import Target, current_target
from pallas._src.tuning.keys import (
    CacheKey,
    args_signature,
    config_json,
    configs_fingerprint,
    function_name,
    normalize_configs,
    user_key,
)
from pallas._src.tuning.report import TuningReport
from pallas._src.tuning.search import Bound, TuningError, run_search
from pallas._src.tuning.timer import Timer

ENV_MODE = "PALLAS_AUTOTUNE"
MODES = ("off", "cached", "on")


class AutotuneWarning(UserWarning):
    """An autotuned function ran an untuned config (under ``jit``, with nothing cached)."""


def mode() -> str:
    """``PALLAS_AUTOTUNE``: ``on`` (default: search on a cache miss), ``cached`` (use the
    cache, never search), ``off`` (always the first config)."""
    m = os.environ.get(ENV_MODE, "on").strip().lower() or "on"
    if m not in MODES:
        raise ValueError(f"{ENV_MODE}={m!r}: expected one of {', '.join(MODES)}")
    return m


def _concrete(args: Sequence, kwargs: Mapping) -> bool:
    return not any(isinstance(x, jax.core.Tracer)
                   for x in jax.tree_util.tree_leaves((tuple(args), dict(kwargs))))


class Autotuned:
    """A function of ``(*args, **config)`` that picks its config by search (see
    :func:`autotune`). ``last_report`` holds the report of the latest choice."""

    def __init__(self, f: Callable, configs: Sequence[Mapping[str, Any]], *, key=None,
                 prune=None, warmup: int = 1, repeats: int = 5, timer: Timer | None = None,
                 cache: TuningCache | None = None) -> None:
        if not callable(f):
            raise TypeError(f"autotune: expected a function, got {f!r}")
        if warmup < 0 or repeats < 1:
            raise ValueError(f"autotune: warmup must be >= 0 and repeats >= 1, got "
                             f"warmup={warmup}, repeats={repeats}")
        if key is not None and not callable(key):
            raise TypeError(f"autotune: key must be a function of the arguments, got {key!r}")
        self.f, self.configs = f, normalize_configs(configs)
        self.key_fn, self.prune, self.warmup, self.repeats = key, prune, warmup, repeats
        self.timer = timer or Timer()
        self._cache = cache
        self.name = function_name(f)
        self.fingerprint = configs_fingerprint(self.configs)
        self._by_json = {config_json(c): c for c in self.configs}
        self._chosen: dict[CacheKey, dict] = {}
        self._backends: dict[tuple, str] = {}
        self._warned = False
        self._lock = threading.Lock()
        self.last_report: TuningReport | None = None
        functools.update_wrapper(self, f)

    @property
    def cache(self) -> TuningCache:
        return self._cache if self._cache is not None else TuningCache()

    def key(self, args: Sequence, kwargs: Mapping, target: Target) -> CacheKey:
        """The cache key of a call with ``args`` on ``target``."""
        sig = (user_key(self.key_fn, args, kwargs) if self.key_fn is not None
               else args_signature(args, kwargs))
        memo = (sig, target.platform)
        if memo not in self._backends:
            self._backends[memo] = self._backend_label(args, kwargs, target.platform)
        return CacheKey(self.name, sig, self.fingerprint, self._backends[memo], target.device)

    def _backend_label(self, args, kwargs, platform: str) -> str:
        bound = Bound.of(self.f, args, kwargs)
        for c in self.configs:
            try:
                return kernels.backend_label(bound.pallas_calls(c), platform)
            except Exception:  # noqa: BLE001 - the next config may trace
                continue
        return "untraceable"

    def lookup(self, key: CacheKey) -> dict | None:
        """The cached winner for ``key`` (memory first, then the SQLite cache)."""
        if key in self._chosen:
            return self._chosen[key]
        entry = self.cache.get(key)
        config = self._by_json.get(config_json(entry["config"])) if entry else None
        if config is not None:
            self._chosen[key] = config
        return config

    def search(self, args: Sequence, kwargs: Mapping, *, target: Target | None = None,
               store: bool = True) -> TuningReport:
        """Searches now (concrete ``args``), files the winner, and returns the report."""
        target = target or current_target()
        key = self.key(args, kwargs, target)
        with self._lock:
            report = run_search(self.f, self.configs, args, kwargs, target=target,
                                prune=self.prune, warmup=self.warmup, repeats=self.repeats,
                                timer=self.timer, name=self.name, key=key)
        if store:
            score = next(r.median if r.median is not None else r.estimate
                         for r in report.results if r.status == "chosen")
            self.cache.put(key, report.chosen, method=report.method, score=score,
                           details=report.details())
        self._chosen[key] = report.chosen
        self.last_report = report
        return report

    def choose(self, args: Sequence, kwargs: Mapping) -> dict:
        """The config a call with these arguments runs (searching if allowed and needed)."""
        m = mode()
        if m == "off":
            return self._default("PALLAS_AUTOTUNE=off")
        target = current_target()
        key = self.key(args, kwargs, target)
        found = self.lookup(key)
        if found is not None:
            self.last_report = TuningReport(self.name, key, "cache", found)
            return found
        if m == "cached":
            return self._default("PALLAS_AUTOTUNE=cached and nothing is cached")
        if not _concrete(args, kwargs):
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"autotune: {self.name} called under jit with no tuned config for "
                    f"{key.signature} on {key.device}; running configs[0] "
                    f"{config_json(self.configs[0])}. Tune ahead of time with "
                    f"pallas.tuning.tune(f, *example_args) (arrays or "
                    f"jax.ShapeDtypeStructs), or call f once outside jit.",
                    AutotuneWarning, stacklevel=3)
            return self._default("under jit, nothing cached")
        return self.search(args, kwargs, target=target).chosen

    def _default(self, why: str) -> dict:
        self.last_report = TuningReport(self.name, None, "default", self.configs[0],
                                        why_model=why)
        return self.configs[0]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.f(*args, **kwargs, **self.choose(args, kwargs))


def autotune(configs: Sequence[Mapping[str, Any]], *, key: Callable | None = None,
             prune: Callable | Sequence[Callable] | None = None, warmup: int = 1,
             repeats: int = 5, timer: Timer | None = None,
             cache: TuningCache | None = None) -> Callable[[Callable], Autotuned]:
    """Decorates ``f(*args, **config)`` to run with the fastest of ``configs``.

    Args:
      configs: dicts of keyword arguments for ``f`` (block sizes, ``num_warps``, ...).
      key: ``key(*args, **kwargs)`` -> a JSON-able value to file winners under instead of
        the arguments' shapes and dtypes.
      prune: ``prune(config, *args)`` -> a reason (str) to drop the config before timing,
        or a false value to keep it; or a list of such functions.
      warmup: untimed runs of each config (compilation happens here).
      repeats: timed runs of each config; their median decides.
      timer: a :class:`~pallas.tuning.Timer` (tests pass one with a fake clock).
      cache: the :class:`~pallas.tuning.TuningCache` (default: ``PALLAS_TUNING_CACHE`` or
        the user cache directory).
    """
    configs = normalize_configs(configs)  # bad configs are an error where they are written

    def wrap(f: Callable) -> Autotuned:
        return Autotuned(f, configs, key=key, prune=prune, warmup=warmup, repeats=repeats,
                         timer=timer, cache=cache)
    return wrap


def example_arrays(args: Any, seed: int = 0) -> Any:
    """``args`` with every ``jax.ShapeDtypeStruct`` replaced by random data of its shape."""
    rng = np.random.default_rng(seed)

    def fill(x):
        if not isinstance(x, jax.ShapeDtypeStruct):
            return x
        dt = np.dtype(x.dtype)
        if dt == np.bool_:
            return jax.numpy.asarray(rng.random(x.shape) < 0.5)
        if np.issubdtype(dt, np.integer):
            return jax.numpy.asarray(rng.integers(0, 16, x.shape), dtype=dt)
        return jax.numpy.asarray(rng.standard_normal(x.shape), dtype=dt)

    return jax.tree_util.tree_map(fill, args)


def tune(f: Autotuned, *args: Any, platform: str | None = None, kind: str | None = None,
         **kwargs: Any) -> TuningReport:
    """Tunes ``f`` ahead of time for these arguments and files the winner in the cache.

    ``args`` may be arrays or ``jax.ShapeDtypeStruct``s (filled with random data). With
    ``platform``/``kind`` naming a device this host does not have (``"tpu"``, ``"v5e"``),
    or under ``PALLAS_EMULATE_DEVICE``, the configs are ranked by the static model
    instead of timed; the report says so. Returns the search's report.
    """
    if not isinstance(f, Autotuned):
        raise TypeError(f"tune: expected a function decorated with "
                        f"pallas.tuning.autotune, got {f!r}")
    target = current_target(platform, kind)
    if target.measured:
        args, kwargs = example_arrays((args, kwargs))
    return f.search(args, kwargs, target=target)


__all__ = ["AutotuneWarning", "Autotuned", "TuningError", "autotune", "example_arrays",
           "mode", "tune"]
