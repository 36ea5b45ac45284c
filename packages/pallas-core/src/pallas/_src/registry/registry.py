"""Discovery of backends through entry points, listing, and backend selection.

Discovery is lazy (at first use), deterministic (entry points sorted by name) and loud:
a plugin that fails to load is reported with its name and exception, at discovery and
again whenever someone asks for a backend it might have provided. A backend asked for by
name loads only the entry point of that name when it provides the backend; listing,
selection by platform and the interpreter load them all.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import os
import threading
import warnings
from collections.abc import Mapping
from typing import Any

import pluggy

from pallas._src.registry import hookspecs
from pallas._src.registry.backend import Backend
from pallas._src.registry.params import (  # noqa: F401 - resolve_compiler_params: re-exported
    DICT_KEY_ALIASES,
    resolve_compiler_params,
)

ENTRY_POINT_GROUP = "pallas.backends"

KNOWN_PACKAGES = {
    "interpret": "pallas-core",
    "triton": "pallas-triton",
    "mosaic_gpu": "pallas-mosaic-gpu",
    "mosaic_tpu": "pallas-tpu",
    "mosaic_sparsecore": "pallas-tpu-sparsecore",
}


class BackendNotFoundError(ValueError):
    """The requested backend is not installed (the message names the package)."""


class BackendLoadError(BackendNotFoundError, RuntimeError):
    """A backend plugin failed to load: raised when a backend it might have provided is
    requested, and recorded (``load_failures()``) for a plugin whose hooks are wrong.

    ``plugin`` is the entry-point name; ``__cause__`` the plugin's own exception.
    """

    plugin: str = ""


class PluginLoadWarning(UserWarning):
    """Emitted once when a plugin in ``pallas.backends`` fails to load."""


# Users catch these by their public path, so tracebacks print that path too.
for _cls in (BackendNotFoundError, BackendLoadError, PluginLoadWarning):
    _cls.__module__ = "pallas.plugins"



@dataclasses.dataclass
class _State:
    loaded: bool = False  # every entry point loaded (full discovery done)
    backends: dict = dataclasses.field(default_factory=dict)
    sources: dict = dataclasses.field(default_factory=dict)  # backend name -> provider
    failures: dict = dataclasses.field(default_factory=dict)  # entry point -> exception
    manager: pluggy.PluginManager | None = None
    entry_points: list | None = None  # the group's entry points, sorted
    seen: set = dataclasses.field(default_factory=set)  # entry-point values loaded
    ep_names: dict = dataclasses.field(default_factory=dict)  # pluggy name -> (ep, value)


_state = _State()
_lock = threading.RLock()


def _plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def _report(plugin: str, exc: Exception, what: str) -> None:
    """Records a plugin failure under its entry-point name and warns about it."""
    _state.failures[plugin] = exc
    warnings.warn(
        f"Pallas backend plugin {plugin!r} {what}: {type(exc).__name__}: {exc}",
        PluginLoadWarning,
        stacklevel=4,
    )


def _entry_points() -> list:
    """The ``pallas.backends`` entry points, sorted by name (read once per discovery)."""
    if _state.entry_points is None:
        _state.entry_points = sorted(
            importlib.metadata.entry_points(group=ENTRY_POINT_GROUP),
            key=lambda ep: (ep.name, ep.value))
    return _state.entry_points


def _load(eps: list) -> None:
    """Loads the entry points ``eps`` not loaded yet, in order: imports each plugin,
    registers it, and adds its backends and interpreter rules (failures reported)."""
    if _state.manager is None:
        _state.manager = _plugin_manager()
    pm = _state.manager
    new = []  # pluggy names of the plugins registered now
    for ep in eps:
        if ep.value in _state.seen:
            continue  # loaded already, or the same distribution visible twice on sys.path
        _state.seen.add(ep.value)
        try:
            module = ep.load()
            pm_name = f"{ep.name} ({ep.value})"
            pm.register(module, name=pm_name)
            _state.ep_names[pm_name] = (ep.name, ep.value)
            new.append(pm_name)
        except Exception as e:  # noqa: BLE001 - reported, not swallowed
            _report(ep.name, e, f"({ep.value}) failed to load")
    _reject_unknown_hooks(pm, _state.ep_names)
    for impl in pm.hook.pallas_backends.get_hookimpls():
        if impl.plugin_name not in new:
            continue
        name, value = _state.ep_names[impl.plugin_name]
        try:
            provided = impl.function()
        except Exception as e:  # noqa: BLE001
            _report(name, e, f"({value}) failed in pallas_backends()")
            continue
        for b in provided or []:
            _add(b, name)
    from pallas._src.interpreter.rules import interpret_rules

    for impl in pm.hook.pallas_interpret_rules.get_hookimpls():
        if impl.plugin_name not in new:
            continue
        name, value = _state.ep_names[impl.plugin_name]
        try:
            for prim, rule in dict(impl.function() or {}).items():
                interpret_rules.register(prim, owner=name)(rule)
        except Exception as e:  # noqa: BLE001
            _report(name, e, f"({value}) failed in pallas_interpret_rules()")


def _discover() -> None:
    """Loads every plugin of the group (once)."""
    with _lock:
        if _state.loaded:
            return
        _load(_entry_points())
        _state.loaded = True


def _discover_named(name: str) -> None:
    """Loads only the entry point called ``name`` (if not loaded yet): a backend asked
    for by name does not import every other installed plugin (a first ``pallas_call``
    for ``mosaic_gpu`` paid ~0.15 CPU s importing the TPU and Triton backends)."""
    with _lock:
        if not _state.loaded:
            _load([ep for ep in _entry_points() if ep.name == name])


def _reject_unknown_hooks(pm: pluggy.PluginManager, ep_names: dict) -> None:
    """A ``@hookimpl`` function that names no hook of ``hookspecs`` (a misspelling, like
    ``pallas_backend``) makes its plugin fail to load, reported under the plugin's name
    with the hooks it may have meant (pluggy's ``check_pending``, per plugin)."""
    known = [n for n in dir(hookspecs) if n.startswith("pallas_")]
    for hook_name in sorted(vars(pm.hook)):
        caller = getattr(pm.hook, hook_name)
        if not isinstance(caller, pluggy.HookCaller) or caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            if pm.get_plugin(impl.plugin_name) is None:
                continue  # already rejected for another unknown hook
            name, value = ep_names.get(impl.plugin_name, (impl.plugin_name, "?"))
            close = difflib.get_close_matches(hook_name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            exc = BackendLoadError(
                f"Pallas backend plugin {name!r} ({value}) implements {hook_name!r}, which "
                f"is not a Pallas hook (the hooks are {', '.join(known)}){hint}")
            exc.plugin = name
            pm.unregister(name=impl.plugin_name)
            _report(name, exc, f"({value}) failed to load")


def _add(backend: Backend, source: str) -> None:
    """Adds ``backend`` from plugin ``source``. A name two plugins provide goes to the
    entry point of that name if there is one (whichever loaded first), else to the
    first plugin in entry-point order; the other is reported as a duplicate."""
    if not isinstance(backend, Backend):
        _report(source, TypeError(
            f"plugin {source} returned {backend!r}, which is not a pallas.plugins.Backend"
        ), "provided an invalid backend")
        return
    if backend.name in _state.backends:
        other, other_source = _state.backends[backend.name], _state.sources[backend.name]
        if source == backend.name != other_source:  # its own entry point wins
            _state.backends[backend.name], _state.sources[backend.name] = backend, source
            backend, other, source = other, backend, other_source
        _report(source, ValueError(
            f"backend name {backend.name!r} from {source} is already provided by "
            f"{other.package or 'another plugin'}"
        ), "provided a duplicate backend")
        return
    _state.backends[backend.name] = backend
    _state.sources[backend.name] = source


def ensure_discovered() -> None:
    """Discovers the installed plugins now (their interpreter rules included)."""
    _discover()


def register_backend(backend: Backend) -> None:
    """Registers a backend object directly (for tests and in-process plugins)."""
    _discover()
    with _lock:
        _add(backend, f"register_backend({backend.name})")


def reset() -> None:
    """Forgets discovered backends; the next use discovers them again."""
    with _lock:
        _state.loaded = False
        _state.backends.clear()
        _state.sources.clear()
        _state.failures.clear()
        _state.manager = None
        _state.entry_points = None
        _state.seen.clear()
        _state.ep_names.clear()


def list_backends() -> list[Backend]:
    """Every installed backend, sorted by name."""
    _discover()
    return [_state.backends[k] for k in sorted(_state.backends)]


def load_failures() -> dict[str, Exception]:
    """Plugins that failed to load, by entry-point name, with their exceptions."""
    _discover()
    return dict(_state.failures)


def _missing(name: str) -> BackendNotFoundError:
    """The error for a backend that is not there: a :class:`BackendLoadError` when the
    plugin of that name failed to load, else a :class:`BackendNotFoundError`."""
    pkg = KNOWN_PACKAGES.get(name)
    installed = ", ".join(sorted(_state.backends)) or "none"
    hint = f" Install it with `pip install {pkg}`." if pkg else ""
    failed = ""
    if _state.failures:
        failed = " Plugins that failed to load: " + "; ".join(
            f"{k}: {type(e).__name__}: {e}" for k, e in sorted(_state.failures.items())
        ) + "."
    message = f"Pallas backend {name!r} is not installed (installed: {installed}).{hint}{failed}"
    cause = _state.failures.get(name)
    if cause is not None:  # its own plugin (entry point of the same name) failed to load
        err = BackendLoadError(f"Pallas backend {name!r} failed to load: "
                               f"{type(cause).__name__}: {cause}.{failed}")
        err.plugin = name
        err.__cause__ = cause
        return err
    return BackendNotFoundError(message)


def get_backend(name: str) -> Backend:
    """The installed backend called ``name``; a clear error naming its package if absent.

    Loads the plugin whose entry point is called ``name`` first, and all the others only
    if that one does not provide it."""
    if name not in _state.backends:
        _discover_named(name)
    if name not in _state.backends:
        _discover()
    try:
        return _state.backends[name]
    except KeyError:
        err = _missing(name)
    raise err from err.__cause__


def backend_for_core_type(core_type: Any) -> str:
    """The name of the installed backend whose ``core_types`` include ``core_type``."""
    _discover()
    for b in sorted(_state.backends.values(), key=lambda b: b.name):
        if core_type in b.core_types:
            return b.name
    claimed = {str(t): b.name for b in _state.backends.values() for t in b.core_types}
    known = ", ".join(f"{t} ({n})" for t, n in sorted(claimed.items())) or "none"
    raise BackendNotFoundError(
        f"No installed Pallas backend runs meshes of core_type {core_type!r} "
        f"(core types the installed backends run: {known}). For a SparseCore core type "
        f"install pallas-tpu-sparsecore.")


def env_var(platform: str) -> str:
    return f"PALLAS_BACKEND_{platform.upper()}"


def requested_backend(backend: str | None, compiler_params: Any) -> str | None:
    """The backend named explicitly, by ``backend=`` or by the compiler params' type."""
    if backend is not None:
        return backend
    if compiler_params is None or isinstance(compiler_params, Mapping):
        return None
    name = getattr(compiler_params, "BACKEND", None)
    if name is not None:
        return name
    # A CompilerParams type that does not name its backend: ask the backends.
    _discover()
    for b in _state.backends.values():
        if b.compiler_params_type is not None and isinstance(
                compiler_params, b.compiler_params_type):
            return b.name
    return None


def _for_platform(b: Backend, platform: str, why: str) -> Backend:
    if platform not in b.platforms and "*" not in b.platforms:
        target = b.platforms[0] if b.platforms else platform
        raise ValueError(
            f"Pallas backend {b.name!r}{why} lowers for {', '.join(b.platforms)}, not for "
            f"platform {platform!r}. To run this kernel here, pass interpret=True to "
            f"pallas_call (the reference interpreter; backend primitives included), or "
            f"leave out backend=/compiler_params so the default backend for {platform!r} "
            f"is chosen. To see what {b.name!r} generates without a {target} device, "
            f"lower ahead of time: jax.jit(f).trace(*args).lower("
            f"lowering_platforms=({target!r},))."
        )
    return b


def check_compiler_params_dict(compiler_params: Mapping) -> None:
    """Checks the dict form ``{backend name: {option: value}}`` at trace time: every key
    names a backend (installed or first-party) and every value is a dict."""
    _discover()
    known = set(KNOWN_PACKAGES) | set(_state.backends)
    known |= {a for aliases in DICT_KEY_ALIASES.values() for a in aliases}
    for key, sub in compiler_params.items():
        if key not in known:
            raise ValueError(
                f"compiler_params[{key!r}]: no Pallas backend is called {key!r}; the dict "
                f"form maps a backend name to its options, one of: {', '.join(sorted(known))}"
                f" (or pass the backend's CompilerParams, e.g. pltpu.CompilerParams(...))"
            )
        if not isinstance(sub, Mapping):
            raise TypeError(
                f"compiler_params[{key!r}] must be a dict of {key}'s options; got "
                f"{type(sub).__name__}"
            )


def select_backend(platform: str, backend: str | None = None,
                   compiler_params: Any = None) -> Backend:
    """Chooses the backend for ``platform`` in the documented order.

    1. ``backend=`` given to ``pallas_call``; 2. the type of ``compiler_params``;
    3. the environment variable ``PALLAS_BACKEND_<PLATFORM>``; 4. the installed backend
    with the highest priority for the platform (ties: the first name alphabetically).
    """
    explicit = requested_backend(backend, compiler_params)
    if explicit is not None:
        return _for_platform(get_backend(explicit), platform, "")
    from_env = os.environ.get(env_var(platform))
    if from_env:
        return _for_platform(get_backend(from_env), platform, f" (from {env_var(platform)})")
    _discover()
    candidates = [b for b in _state.backends.values() if platform in b.platforms]
    if not candidates:
        pkgs = {"cuda": "pallas-triton or pallas-mosaic-gpu", "rocm": "pallas-triton",
                "tpu": "pallas-tpu"}
        hint = pkgs.get(platform)
        raise BackendNotFoundError(
            f"No installed Pallas backend lowers for platform {platform!r}"
            + (f"; install {hint}" if hint else "")
            + ". Or pass interpret=True to run the kernel in the interpreter."
        )
    # Highest priority wins; ties go to the alphabetically first name.
    return min(candidates, key=lambda b: (-b.priority_for(platform), b.name))
