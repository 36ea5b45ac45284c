"""What the TPU compiler made of one kernel, and how a failure is reported."""

from __future__ import annotations

import collections
import dataclasses
import re

from pallas.plugins import LevelUnreachableError

# An op of the LLO dialect at the start of a statement (``%3 = llo.vmul.f32 ...`` or
# ``llo.vector_store ...``); attributes such as ``{llo.type = i32}`` are not ops.
_LLO_OP = re.compile(r"^\s*(?:%[\w#:]+(?:\s*,\s*%[\w#:]+)*\s*=\s*)?\"?llo\.([\w.]+)", re.M)

# The op mix's categories, by LLO op name (the first matching rule wins).
_CATEGORIES = (
    ("dma", lambda op: "dma" in op),
    ("mxu", lambda op: op.startswith(("vmatmul", "vmatres", "vmatpush", "vlatch", "vdwg",
                                      "matmul", "mxu", "vmatprep"))),
    ("vector_load", lambda op: op.startswith(("vector_load", "vld"))),
    ("vector_store", lambda op: op.startswith(("vector_store", "vst"))),
    ("constant", lambda op: op == "constant"),
    ("scalar", lambda op: op.startswith("s")),
    ("vector", lambda op: op.startswith("v")),
)
CATEGORIES = tuple(name for name, _ in _CATEGORIES) + ("other",)


def llo_ops(llo: str) -> collections.Counter:
    """Static counts of the LLO ops in ``llo`` by op name (``vector_load``, ``vmatmul``,
    ``sadd.s32``, ...); an op inside a loop counts once."""
    return collections.Counter(m.group(1) for m in _LLO_OP.finditer(llo))


def op_mix(llo: str) -> dict[str, int]:
    """The LLO's ops by category: ``vector_load``, ``vector_store``, ``mxu`` (matmul
    pushes, latches, results), ``dma`` (DMA starts and waits), ``scalar`` (the scalar
    unit's ops), ``vector`` (other vector-unit ops), ``constant``, ``other``, ``total``."""
    mix = dict.fromkeys(CATEGORIES, 0)
    for op, n in llo_ops(llo).items():
        name = next((c for c, rule in _CATEGORIES if rule(op)), "other")
        mix[name] += n
    mix["total"] = sum(mix[c] for c in CATEGORIES)
    return mix


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    """What libtpu made of one kernel for one chip (all figures read from its output).

    Attributes:
      name: the kernel's name.
      chip: the chip it was compiled for (``"v5e"``, ...); ``target`` is the same.
      vmem_bytes: the scoped VMEM XLA allocated for the kernel (its pipelined blocks,
        scratch and Mosaic's internal scratch), from the compiled HLO.
      scoped_memory: every scoped allocation, by XLA memory space id (``"1"``: VMEM).
      mosaic: the Mosaic module after its layout passes (``post-apply-vector-layout``).
      llo: the final LLO (``post-finalize-llo``): what the op mix counts.
      stages: the names of every stage Mosaic dumped, in order.
      memory: XLA's ``memory_analysis()`` of the executable (argument, output,
        generated-code bytes).
      seconds: the time the compiler took (in the child process).
    """

    name: str
    chip: str
    vmem_bytes: int
    scoped_memory: dict
    mosaic: str
    llo: str
    stages: tuple
    memory: dict
    seconds: float

    @property
    def target(self) -> str:
        return self.chip

    def op_mix(self) -> dict[str, int]:
        """The final LLO's ops by category (see :func:`op_mix`)."""
        return op_mix(self.llo)

    def llo_ops(self) -> collections.Counter:
        """The final LLO's ops by name (see :func:`llo_ops`)."""
        return llo_ops(self.llo)

    def summary(self) -> str:
        mix = self.op_mix()
        return (f"{self.name} on {self.chip}: VMEM {self.vmem_bytes} B; LLO ops "
                f"{mix['total']} (vector loads {mix['vector_load']}, stores "
                f"{mix['vector_store']}, MXU {mix['mxu']}, DMA {mix['dma']}, scalar "
                f"{mix['scalar']})")


class MosaicError(Exception):
    """Mosaic TPU rejected a kernel: its verifier or compiler does not accept (or does
    not implement) what the kernel asks of the chip. The message carries Mosaic's own
    words (``Not implemented: Only i32 arith.addi is supported, ...``)."""


MosaicError.__module__ = "pallas_tpu.errors"


class TpuCompileError(MosaicError):
    """The TPU compiler rejected a kernel: names the kernel, the chip and its message."""

    def __init__(self, kernel: str, chip: str, message: str):
        self.kernel, self.chip, self.message = kernel, chip, message
        super().__init__(f"the TPU compiler (libtpu) rejects kernel {kernel!r} for chip "
                         f"{chip}: {message}")

    @property
    def target(self) -> str:
        """The chip (what the conformance report records as the compile target)."""
        return self.chip


class TpuCompilerCrashedError(TpuCompileError):
    """The compiler aborted (a ``CHECK`` failure) or hung on the kernel; the child
    process it ran in is gone, the caller is not."""

    def __init__(self, kernel: str, chip: str, message: str):
        self.kernel, self.chip, self.message = kernel, chip, message
        Exception.__init__(self, f"the TPU compiler (libtpu) crashed on kernel {kernel!r} "
                                 f"for chip {chip}: {message}")


class LibtpuMissingError(LevelUnreachableError):
    """libtpu is not installed (``pip install 'pallas-tpu[compile]'``); the conformance
    suite reports the compile level ``skipped`` with this message."""


def mosaic_message(error: str) -> str:
    """The compiler's message without JAX's wrapping: from ``Mosaic failed to compile
    TPU kernel: ...`` on, up to the MLIR location / bug-report boilerplate."""
    text = error
    m = re.search(r"Mosaic failed to compile TPU kernel:\s*", text)
    if m:
        text = text[m.end():]
    text = re.sub(r"^JaxRuntimeError: ", "", text)
    for tail in ("\n\nThe MLIR operation involved:", "\n\nPlease report a bug",
                 "Suspected Python Code Location", "note: see current operation"):
        text = text.split(tail)[0]
    lines = [ln.strip() for ln in text.splitlines()
             if ln.strip() and ln.strip() != "at location: loc(unknown)"]
    return " ".join(lines)
