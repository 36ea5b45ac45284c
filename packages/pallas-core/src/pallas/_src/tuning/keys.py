"""Configs and cache keys: what a tuning search is over and what its winner is filed under."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np


def normalize_configs(configs: Sequence[Mapping[str, Any]]) -> tuple[dict, ...]:
    """The configs as plain dicts, checked: a non-empty sequence of keyword mappings."""
    if isinstance(configs, Mapping) or not isinstance(configs, Sequence | tuple | list):
        raise TypeError(f"autotune: configs must be a sequence of dicts of keyword "
                        f"arguments, got {type(configs).__name__}")
    out = []
    for i, c in enumerate(configs):
        if not isinstance(c, Mapping):
            raise TypeError(f"autotune: configs[{i}] must be a dict of keyword arguments "
                            f"(e.g. {{'block_m': 128}}), got {c!r}")
        bad = [k for k in c if not isinstance(k, str) or not k.isidentifier()]
        if bad:
            raise TypeError(f"autotune: configs[{i}] has keys that are not keyword "
                            f"names: {bad!r}")
        out.append(dict(c))
    if not out:
        raise ValueError("autotune: configs is empty; give at least one config")
    return tuple(out)


def config_json(config: Mapping[str, Any]) -> str:
    """A config as canonical JSON (sorted keys); values that JSON lacks use their repr."""
    return json.dumps(dict(config), sort_keys=True, default=repr)


def configs_fingerprint(configs: Sequence[Mapping[str, Any]]) -> str:
    """A short hash of the config list, so a changed list never reuses an old winner."""
    text = "\n".join(config_json(c) for c in configs)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def function_name(f: Callable) -> str:
    """``module.qualname`` of the tuned function (what the cache files it under)."""
    f = getattr(f, "__wrapped__", f)
    return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', repr(f))}"


def _leaf_signature(x: Any) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{np.dtype(x.dtype).name}{list(x.shape)}"
    if isinstance(x, bool | int | float | complex | str | type(None)):
        return f"{type(x).__name__}:{x!r}"
    return type(x).__name__


def args_signature(args: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> str:
    """The shapes and dtypes of every array argument (static values by their repr)."""
    leaves, tree = jax.tree_util.tree_flatten((tuple(args), dict(kwargs or {})))
    return f"{', '.join(map(_leaf_signature, leaves))} | {tree}"


def user_key(key: Callable[..., Any], args: Sequence[Any], kwargs: Mapping) -> str:
    """The user's ``key(*args, **kwargs)`` as canonical JSON."""
    return "key:" + json.dumps(key(*args, **kwargs), sort_keys=True, default=repr)


@dataclasses.dataclass(frozen=True)
class CacheKey:
    """What a winning config is filed under.

    Attributes:
      function: ``module.qualname`` of the tuned function.
      signature: argument shapes and dtypes, or the user's ``key``.
      configs: hash of the config list (:func:`configs_fingerprint`).
      backend: the backends of the function's ``pallas_call``s with their versions
        (``"interpret 0.1.0"``, ``"mosaic_tpu 0.1.0"``, ...).
      device: the device kind it was tuned for (``"cpu"``, ``"NVIDIA H100"``,
        ``"emulated tpu:v5e"``, ...).
    """

    function: str
    signature: str
    configs: str
    backend: str
    device: str

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)
