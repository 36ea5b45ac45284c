"""Deserialising the Mosaic module a ``tpu_custom_call`` carries (its backend config)."""

from __future__ import annotations

import base64
import functools
import json

from jaxlib.mlir import ir
from jaxlib.mlir.passmanager import PassManager
from jaxlib.mosaic.python import tpu

from pallas_tpu._src import jax_compat as jc


def payload_of(backend_config: bytes | str) -> bytes:
    """The serialised module (MLIR bytecode after ``mosaic-serde``) in a backend config."""
    cfg = json.loads(backend_config)
    return base64.b64decode(cfg["custom_call_config"]["body"])


@functools.lru_cache(maxsize=256)
def deserialize(payload: bytes) -> tuple[ir.Context, ir.Module]:
    """Parses the bytecode and undoes the serde pass (as the TPU compiler does first)."""
    ctx = jc.make_ir_context()
    tpu.register_dialect(ctx)
    with ctx, ir.Location.unknown():
        ctx.allow_unregistered_dialects = True
        module = ir.Module.parse(payload)
        PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(module.operation)
    return ctx, module
