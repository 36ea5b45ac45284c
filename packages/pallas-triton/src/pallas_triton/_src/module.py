"""Turns generated source text into a live ``@triton.jit`` function.

The text is registered with :mod:`linecache` under a synthetic file name, so Triton (and
tracebacks) can read the source back, exactly as if it came from a file.
"""

from __future__ import annotations

import hashlib
import linecache
import threading
import types

_lock = threading.Lock()
_modules: dict[str, types.ModuleType] = {}


def load(source: str, name: str, variant: str = "gpu", overrides: dict | None = None):
    """Executes ``source`` once per distinct text and variant; returns attribute ``name``.

    ``overrides`` replace module globals after execution (the emulator swaps in its own
    ``libdevice``); each variant is a separate module.
    """
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    key = f"{digest}-{variant}"
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            filename = f"<pallas-triton {name} {digest} {variant}>"
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
            code = compile(source, filename, "exec")
            mod = types.ModuleType(f"pallas_triton_generated_{digest}")
            mod.__file__ = filename
            exec(code, mod.__dict__)
            mod.__dict__.update(overrides or {})
            _modules[key] = mod
    return getattr(mod, name)
