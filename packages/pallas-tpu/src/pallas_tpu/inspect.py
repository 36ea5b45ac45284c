"""Looking inside lowered TPU kernels (beyond upstream; for tests and debugging).

``mosaic_modules(lowered)`` finds every ``tpu_custom_call`` in a lowered JAX program
(``jax.jit(f).trace(...).lower(lowering_platforms=("tpu",))``, a ``jax.export``-ed
function, or StableHLO text), decodes the serialized Mosaic module it carries,
deserializes it with the TPU dialect loaded, verifies it, and returns the modules.
"""

from __future__ import annotations

import base64
import json
import re

from jaxlib.mlir import ir
from jaxlib.mlir.passmanager import PassManager

from pallas_tpu._src.lowering.kernel import new_context

_CONFIG = re.compile(r'@tpu_custom_call\([^)]*\)\s*\{backend_config\s*=\s*"((?:[^"\\]|\\.)*)"')


def _unescape_mlir_string(s: str) -> str:
    return re.sub(r"\\([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), s).replace(
        '\\"', '"').replace("\\\\", "\\")


def backend_configs(lowered) -> list[dict]:
    """The JSON backend configs of every ``tpu_custom_call`` in ``lowered``."""
    text = lowered if isinstance(lowered, str) else _text(lowered)
    return [json.loads(_unescape_mlir_string(m)) for m in _CONFIG.findall(text)]


def _text(lowered) -> str:
    if hasattr(lowered, "mlir_module"):  # jax.export.Exported
        return lowered.mlir_module()
    return lowered.as_text()


def mosaic_modules(lowered) -> list[ir.Module]:
    """The verified Mosaic TPU modules carried by the kernels' custom calls."""
    out = []
    for cfg in backend_configs(lowered):
        body = base64.b64decode(cfg["custom_call_config"]["body"])
        ctx = new_context()
        with ctx, ir.Location.unknown():
            ctx.allow_unregistered_dialects = True
            module = ir.Module.parse(body)
            PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(
                module.operation)
            ctx.allow_unregistered_dialects = False
            if not module.operation.verify():
                raise RuntimeError("a Mosaic module carried by a tpu_custom_call does not verify")
        out.append(module)
    return out


def op_names(module: ir.Module) -> list[str]:
    """The names of every operation in ``module``, in walk order."""
    names: list[str] = []

    def visit(op):
        names.append(op.name)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return names
