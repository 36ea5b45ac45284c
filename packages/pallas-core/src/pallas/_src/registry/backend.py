"""The :class:`Backend` base class that plugins subclass or instantiate."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pallas._src.registry.artifacts import artifact_for
from pallas._src.registry.params import resolve_compiler_params
from pallas._src.registry.requests import KernelArtifact, KernelRequest, LoweringRequest

LEVELS = ("lower", "compile", "backend_interpret", "emulate", "execute")


class LevelUnsupportedError(NotImplementedError):
    """Raised by a backend's ``compile``/``emulate``/``interpret`` for a kernel it cannot
    take at that level although it claims its features (e.g. an op its emulator does not
    execute yet). The conformance suite reports the case ``unsupported`` at that level,
    with this error's message, instead of failed; it must never stand for wrong numbers.
    """


class LevelUnreachableError(RuntimeError):
    """Raised by a backend's ``compile``/``emulate``/``interpret`` when this machine
    cannot reach the level at all (its compiler is not installed, say). The conformance
    suite reports the case ``skipped`` with this error's message, which should say what
    to install.
    """


@dataclasses.dataclass
class Backend:
    """A Pallas backend: what it is, what it claims, and how it lowers.

    Subclasses override :meth:`lower` (required), and :meth:`validate`,
    :meth:`compile`, :meth:`emulate` and :meth:`interpret` where they have them. Each
    takes one typed request (:class:`~pallas.plugins.KernelRequest`,
    :class:`~pallas.plugins.LoweringRequest`). A subclass written against the old
    keyword signatures (``lower(ctx, *in_nodes, jaxpr=..., ...)``,
    ``compile(jaxpr, grid_mapping, compiler_params, **kw)``, ...) is refused with a
    ``TypeError`` when it is defined. What else a backend may offer is declared here
    with a default: :meth:`emulator`, :meth:`targeting`, :meth:`race_kit`,
    :meth:`tuning_figures`.

    Attributes:
      name: unique backend name (``"triton"``, ``"mosaic_tpu"``, a third party's).
      version: the backend package's version.
      platforms: JAX platforms it lowers for.
      compiler_params_type: its ``CompilerParams`` subclass; passing an instance to
        ``pallas_call`` selects this backend.
      capabilities: conformance-catalogue tags the backend claims.
      levels: conformance levels it provides, among ``lower``, ``compile``,
        ``backend_interpret`` (the kernel jaxpr under the backend's own interpret rules:
        its semantics, not its generated code), ``emulate`` (the generated code
        executed), ``execute``.
      priority: used to choose between backends for the same platform (higher wins);
        an int, or a mapping from platform to int (platforms not listed get 0).
      package: the distribution that provides it (named in "not installed" errors).
      display_name: how errors name the backend (e.g. ``"Triton"``); ``name`` if empty.
      core_types: the ``core_type`` values of meshes this backend runs (e.g.
        ``pltpu.CoreType.SC_VECTOR_SUBCORE``): ``pl.kernel`` over a mesh that is not a
        :class:`~pallas.plugins.Mesh` (an upstream-style mesh object with ``shape`` and
        ``core_type``) picks its backend by them.
    """

    name: str
    version: str
    platforms: tuple[str, ...]
    compiler_params_type: type | None = None
    capabilities: frozenset = frozenset()
    levels: tuple[str, ...] = ("lower",)
    priority: int | dict = 0
    package: str = ""
    display_name: str = ""
    core_types: tuple = ()

    def priority_for(self, platform: str) -> int:
        """This backend's priority when choosing a backend for ``platform``."""
        if isinstance(self.priority, dict):
            return int(self.priority.get(platform, 0))
        return int(self.priority)

    def lower(self, request: LoweringRequest) -> Sequence[Any]:
        """Emits MLIR for ``pallas_call`` on ``request.ctx.module_context.platforms``.

        :param request: the kernel, JAX's lowering context and the operands' MLIR values.
        :return: the output MLIR values (usually the results of one custom call).
        """
        raise NotImplementedError(f"backend {self.name!r} does not implement lower()")

    def validate(self, request: KernelRequest) -> None:
        """Raises a clear error at trace time when the kernel cannot be supported.
        Called by the default :meth:`build`, once per kernel.

        :param request: the kernel, with this backend's compiler params.
        """

    def build(self, request: KernelRequest) -> KernelArtifact:
        """The first stage: validates the kernel once and builds what the later stages
        (``lower``, ``compile``, ``emulate``, ``emulator``, ``interpret``) share. The core
        calls it at trace time when the backend is chosen explicitly, keeps the artifact
        with the ``pallas_call`` equation and hands it to each later stage as
        ``request.artifact``; a stage reads it with :meth:`artifact`. The default calls
        :meth:`validate` (with the compiler params coerced to this backend's type) and
        keeps no payload.

        :param request: the kernel, with this backend's compiler params.
        :return: a :class:`~pallas.plugins.KernelArtifact`.
        """
        params = self.compiler_params_of(request)
        self.validate(dataclasses.replace(request, compiler_params=params))
        return KernelArtifact(backend=self.name, compiler_params=params)

    def artifact(self, request: KernelRequest) -> KernelArtifact:
        """The artifact of ``request``'s kernel: the one the core handed over, else the
        one built for the same kernel earlier, else :meth:`build`'s (then kept)."""
        return artifact_for(self, request)

    def compiler_params_of(self, request: KernelRequest) -> Any:
        """``request.compiler_params`` as this backend's ``compiler_params_type`` (the
        core's one coercion, :func:`pallas.plugins.resolve_compiler_params`; requests
        from the core already carry them so, requests built by hand may not)."""
        return resolve_compiler_params(self, request.compiler_params)

    def compile(self, request: KernelRequest) -> Any:
        """Runs the real compiler on CPU (conformance level ``compile``).

        :param request: the kernel; ``request.options`` may carry e.g. a target.
        :return: the compiled artifact; raises when the compiler rejects the kernel.
        """
        raise NotImplementedError(f"backend {self.name!r} has no compile level")

    def emulate(self, request: KernelRequest, *args: Any) -> Sequence[Any]:
        """Runs the generated code under an emulator (conformance level ``emulate``).

        :param request: the kernel.
        :param args: the operand arrays (scalar prefetch first, then the inputs).
        :return: the output arrays.
        """
        raise NotImplementedError(f"backend {self.name!r} has no emulate level")

    def emulator(self, request: KernelRequest) -> Callable[..., Sequence[Any]]:
        """The executor plan of ``request``'s generated code, built once for an emulated
        device: ``run(*args) -> outputs`` (numpy arrays in, arrays out). The default calls
        :meth:`emulate` on every run; a backend overrides it to lower and prepare once.

        :param request: the kernel; ``request.options`` name the emulated chip.
        """
        return functools.partial(self.emulate, request)

    def interpret(self, request: KernelRequest, *args: Any) -> Sequence[Any]:
        """Runs the kernel jaxpr under the backend's interpret rules (conformance level
        ``backend_interpret``): the backend's semantics, not its generated code.

        :param request: the kernel.
        :param args: the operand arrays.
        :return: the output arrays.
        """
        raise NotImplementedError(f"backend {self.name!r} has no backend_interpret level")

    def targeting(self, platform: str, target: str | None = None
                  ) -> contextlib.AbstractContextManager:
        """Makes ``target`` (a GPU or chip name the backend knows, e.g. ``"gfx942"``) the
        default target of this backend's lowerings for ``platform`` inside a ``with``
        block: what the conformance suite's ``--platform``/``--target`` use, since a
        lowering through ``jax.jit`` carries no options. Backends with several targets
        override it; this default accepts only ``target=None``.
        """
        self.check_platform(platform)
        if target is not None:
            raise ValueError(f"backend {self.name!r} takes no target (got {target!r})")
        return contextlib.nullcontext()

    def check_platform(self, platform: str) -> None:
        """Raises ``ValueError`` unless this backend lowers for ``platform`` (what
        :meth:`targeting` checks first)."""
        if platform not in self.platforms and "*" not in self.platforms:
            raise ValueError(f"backend {self.name!r} lowers for "
                             f"{', '.join(self.platforms)}, not for {platform!r}")

    @staticmethod
    @contextlib.contextmanager
    def environ(var: str, value: str) -> Iterator[None]:
        """Sets the environment variable ``var`` to ``value`` inside a ``with`` block
        and restores it after: how a backend whose lowerings read their target from the
        environment implements :meth:`targeting`."""
        old = os.environ.get(var)
        os.environ[var] = value
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = old

    def race_kit(self) -> Any | None:
        """What the conformance suite's planted-race cases (``pallas_conformance.races``)
        need from a backend whose interpret mode detects data races: its DMAs, memory
        spaces, interpret-mode params and race report (pallas-tpu's ``TpuRaceKit`` is the
        reference). ``None`` (the default): the backend has no such interpret mode.
        """
        return None

    def device_interpret_mode(self) -> Any | None:
        """The interpret mode (an ``InterpretMode`` params object) in which an emulated
        device runs a kernel that addresses other devices (``plgpu.remote_ref``, remote
        semaphores): the executor runs one device's code, this mode every device's.
        ``None`` (the default): the core interpreter runs it, with the cross-device
        rules the backend registered there (pallas-tpu's remote DMAs).
        """
        return None

    def tuning_figures(self, request: KernelRequest, target: Any) -> Mapping[str, Any] | None:
        """Compile figures of one kernel for the autotuner (``registers``,
        ``spill_stores``, ``smem_bytes``, ...; see ``pallas.tuning``), for ``target`` (a
        tuning target with ``compile_options()``, already in ``request.options``).
        ``None`` (the default): the core reads them from :meth:`compile`'s artifact when
        the backend has a ``compile`` level.
        """
        return None

    @property
    def title(self) -> str:
        """How errors name the backend: :attr:`display_name`, else :attr:`name`."""
        return self.display_name or self.name

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        for method in _METHODS:
            fn = cls.__dict__.get(method)
            if fn is not None and _takes_keywords(fn):
                raise TypeError(
                    f"{cls.__module__}.{cls.__qualname__}.{method} has the keyword "
                    f"signature of the old backend contract (a 'jaxpr' parameter); Backend "
                    f"methods take one typed request: "
                    f"{method}{_request_signature(method)}. See "
                    f"docs/backend-authors.md, 'The contract'.")

    def describe(self) -> str:
        return f"{self.name} {self.version} ({', '.join(self.platforms)})"


_METHODS = ("lower", "validate", "compile", "emulate", "interpret")


def _takes_keywords(fn: Any) -> bool:
    """Whether ``fn`` has the older signature, with ``jaxpr`` as its own parameter."""
    try:
        return "jaxpr" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _request_signature(method: str) -> str:
    """``Backend.method``'s signature without ``self``, for the error above."""
    sig = inspect.signature(getattr(Backend, method))
    return str(sig.replace(parameters=list(sig.parameters.values())[1:]))
