"""Compiler params, coerced once: what a backend's stages receive as ``compiler_params``.

``pallas_call(compiler_params=...)`` takes a backend's ``CompilerParams``, or the dict
form ``{backend name: {option: value}}``; :func:`resolve_compiler_params` turns either
into the chosen backend's own type, in this one place, before any stage (``build``,
``lower``, ``compile``, ``emulate``, ``interpret``) sees it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

# Older upstream spellings of the dict form of compiler_params, by backend.
DICT_KEY_ALIASES = {"mosaic_tpu": ("mosaic_tpu", "mosaic")}


def resolve_compiler_params(backend: Any, compiler_params: Any) -> Any:
    """The compiler params ``backend`` receives, coerced here once for every stage: an
    instance of its ``compiler_params_type`` as given; ``None``, or a dict form without
    an entry for it, as the type's defaults; its entry of the dict form built into the
    type; an instance of a base class of the type (``pltpu.CompilerParams`` for
    ``plsc.CompilerParams``) rebuilt as the type. A backend without a type receives
    what was given (its dict entry for the dict form). Anything else is a ``TypeError``
    naming the backend.
    """
    typ = backend.compiler_params_type
    if typ is not None and isinstance(compiler_params, typ):
        return compiler_params
    if isinstance(compiler_params, Mapping):
        sub = None
        for key in DICT_KEY_ALIASES.get(backend.name, (backend.name,)):
            if key in compiler_params:
                sub, used = compiler_params[key], key
                break
        if sub is None:
            return None if typ is None else typ()
        options = sub.thaw() if hasattr(sub, "thaw") else dict(sub)
    elif typ is None:
        return compiler_params
    elif compiler_params is None:
        return typ()
    elif isinstance(typ, type) and issubclass(typ, type(compiler_params)) and \
            dataclasses.is_dataclass(compiler_params):
        return typ(**{f.name: getattr(compiler_params, f.name)
                      for f in dataclasses.fields(compiler_params) if f.init})
    else:
        raise TypeError(
            f"the {backend.title} backend ({backend.name!r}) takes "
            f"{typ.__module__}.{typ.__qualname__} compiler params; got "
            f"{type(compiler_params).__module__}.{type(compiler_params).__qualname__}")
    if typ is None:
        return options
    try:
        return typ(**options)
    except TypeError as e:
        fields = [f.name for f in dataclasses.fields(typ)] if dataclasses.is_dataclass(
            typ) else []
        raise TypeError(
            f"compiler_params[{used!r}] does not fit {typ.__module__}.{typ.__qualname__}: "
            f"{e}" + (f"; its options are {', '.join(fields)}" if fields else "")
        ) from None
