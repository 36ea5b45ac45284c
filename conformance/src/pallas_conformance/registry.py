"""The :class:`Case` type, capability tags, tolerances, the registry, helpers for cases.

A case is a plain-JAX program that calls ``pallas_call`` one or more times. The suite
passes the ``pallas_call`` to use as the first argument, already bound to the mode under
test (``interpret=True`` for the interpreter, ``backend=NAME`` for a backend), so the
same source is run by every level::

    @case("elementwise/add_f32", tags={"elementwise"},
          inputs=lambda rng: (randn(rng, (16, 128)), randn(rng, (16, 128))),
          reference=jnp.add)
    def add(pallas_call, x, y):
        def kernel(x_ref, y_ref, o_ref):
            o_ref[...] = x_ref[...] + y_ref[...]
        return pallas_call(kernel, out_shape=sds_like(x))(x, y)

Cases live in small modules under :mod:`pallas_conformance.cases`, one per subject, which
import this module (never :mod:`pallas_conformance.catalogue`, which imports them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# ------------------------------------------------------------------------------------
# Capability tags. A backend claims a set of these (``Backend.capabilities``); a case
# needs all of its tags claimed to be run for that backend.

TAGS: dict[str, str] = {
    "elementwise": "unary and binary jnp/lax ops on blocks",
    "broadcasting": "broadcasts between blocks of different ranks and shapes",
    "reductions": "sum/max/min/prod/argmax/argmin over each axis",
    "indexing": "pl.ds static and dynamic, strides, ref.at, integer indices, masked "
                "pl.load/pl.store, edge blocks that overhang the array, index maps",
    "control_flow": "pl.when, fori_loop, while_loop, cond, switch, scan, pl.loop, "
                    "program_id/num_programs",
    "dot": "jnp.dot / lax.dot_general inside kernels",
    "scratch": "scratch_shapes and run_scoped buffers",
    "sequential_grid": "kernels that rely on the grid running in order along a reduction "
                       "axis (one that no output's index map uses): output blocks revisited "
                       "and accumulated along it, scratch accumulators that persist across "
                       "its steps (GPU backends run such an axis as a loop in each program)",
    "carry_across_blocks": "state carried from one output block to the next: scratch or a "
                           "semaphore that persists across grid steps writing different "
                           "output blocks (a running sum over the grid); needs the whole "
                           "grid run in order (TPU and the interpreter; not GPUs, whose "
                           "programs for different output blocks run in parallel)",
    "dynamic_grid": "grids whose sizes are traced values (computed inside jax.jit), run "
                    "with program_id/num_programs and index maps as for a static grid; "
                    "upstream lowers them for TPU only (the sizes become operands of the "
                    "custom call)",
    "dynamic_shapes": "jax.export with symbolic dimensions under "
                      "pl.pallas_export_experimental(dynamic_shapes=True): grids and block "
                      "shapes computed from the symbolic shapes, kernels slicing by symbolic "
                      "sizes; the exported function is called on concrete shapes",
    "aliasing": "input_output_aliases",
    "closed_over_refs": "kernels that close over Refs of an enclosing pl.run_state or "
                        "jax.new_ref (passed whole and updated in place, as upstream)",
    "multiple_outputs": "several outputs from one pallas_call",
    "pytrees": "pytrees of operands and outputs",
    "scalar_prefetch": "PrefetchScalarGridSpec and data-dependent index maps",
    "semaphores": "semaphore_signal / semaphore_wait / semaphore_read",
    "atomics": "atomic read-modify-write on refs (pallas.atomics: add/max/min/and/or/"
               "xor/xchg/cas), including masked atomics and contention across programs",
    "unaligned_blocks": "block shapes a tiled memory cannot hold: a last block dim that is "
                        "neither a multiple of 128 nor the array's full dim, or a "
                        "second-to-last one neither a multiple of 8 nor full (TPU's tiling "
                        "rule); cases about odd shapes carry it, the rest use aligned blocks",
    "reshapes": "value reshapes inside kernels that change the tiled (last two) dims: the "
                "last dim split or merged, trailing dims folded into it, leading dims "
                "merged into the second-minor dim, small last dims swapped, folds to rank "
                "1, jnp.stack/jnp.unstack along a tiled dim (what Mosaic TPU relayouts; "
                "GPU backends do not claim them)",
    "stack_pairs": "jnp.stack of two blocks at each axis and jnp.unstack of a size-2 "
                   "axis (what Triton's tl.join/tl.split do)",
    "special_functions": "the gamma family (lgamma, digamma) inside kernels",
    "warpgroups": "GPU warpgroup semantics (pallas_mosaic_gpu): plgpu.kernel meshes of several "
                  "warpgroups per block that specialise on lax.axis_index of the thread axis "
                  "and wait for each other on barriers; scratch shared by the block or "
                  "per warpgroup; registered only when pallas-mosaic-gpu is installed",
    "tma_pipelines": "GPU TMA copies with mbarrier pipelines (pallas_mosaic_gpu): "
                     "copy_gmem_to_smem/copy_smem_to_gmem, barrier_wait/arrive over several "
                     "phases, commit_smem, bulk groups waited with wait_smem_to_gmem, "
                     "plgpu.emit_pipeline; registered only when pallas-mosaic-gpu is installed",
    "wgmma": "Hopper tensor-core matmuls (pallas_mosaic_gpu): plgpu.wgmma from SMEM tiled "
             "(8, swizzle // itemsize) and swizzled into plgpu.ACC accumulators, operands "
             "transposed with transpose_ref, warp-specialised pipelines; registered only "
             "when pallas-mosaic-gpu is installed",
    "clusters": "GPU clusters of blocks (pallas_mosaic_gpu): plgpu.kernel(cluster=...), "
                "TMA loads multicast to every block of the cluster (collective_axes), "
                "plgpu.ClusterBarrier arrivals on the other blocks' barriers; registered "
                "only when pallas-mosaic-gpu is installed",
    "bf16": "bfloat16 operands",
    "f16": "float16 operands",
    "int8": "int8 operands",
    "float8": "float8_e4m3fn / float8_e5m2 values: casts to and from float32 inside the "
              "kernel (round to nearest even, including ties and the carry into the "
              "exponent) and float8 outputs",
    "int4": "int4/uint4 operands (selected, widened; TPUs do no arithmetic in int4)",
    "uint32": "uint32 operands",
    "bool": "boolean operands",
    "vmap": "jax.vmap of pallas_call",
    "grad": "jax.grad / jax.vjp of pallas_call",
    "shard_map": "pallas_call inside jax.shard_map",
    "export": "jax.export of a function that calls pallas_call",
    "kernels": "whole kernels (matmul, softmax, layer norm, attention)",
    "fusion": "kernels with jax.numpy prologues/epilogues fused in by pallas.fuser (block "
              "specs pulled through elementwise ops, broadcasts, reshapes, transposes, "
              "slices and concatenates); the fused kernel is one pallas_call",
    "ref_views": "stores, loads and += through ref.reshape views of a kernel's refs (mixed "
                 "with ref.at), which upstream's TPU tests use",
    "empty_ref": "scratch a kernel allocates itself with jax.empty_ref (upstream's TPU "
                 "tests use it; as run_scoped, it lives until the kernel ends)",
    "ref_bitcast": "loads and stores through ref.bitcast views to a dtype of another width, "
                   "in TPU's layout (the narrower values packed along the second-minor dim, "
                   "as upstream's TPU tests read them)",
    "tpu_dmas": "TPU async copies that outlive their kernel (pallas_tpu): a copy started by "
                "one pallas_call and waited for by the next, its DMA semaphore passed between "
                "them in SEMAPHORE memory; DMAs of run-time size, pltpu.emit_pipeline's "
                "copies of pl.BoundedSlice blocks, of edge blocks and of PRNG keys; "
                "registered only when pallas-tpu is installed",
    "tpu_values": "TPU value primitives (pallas_tpu) inside kernels: pltpu.roll with a "
                  "stride of a packed type, pltpu.bitcast between element types of "
                  "different widths (packed along the second-minor dim), pltpu.trace_value "
                  "profiler annotations; registered only when pallas-tpu is installed",
    "sparsecore": "TPU SparseCore kernels (pallas_tpu_sparsecore): indexed DMAs (embedding "
                  "gathers, scatter-add segment sums with repeated indices, ignored "
                  "indices), vector gathers/scatters, scalar-subcore control; registered "
                  "only when pallas-tpu-sparsecore is installed",
}

# Other spellings of a tag that backends may claim.
TAG_ALIASES: dict[str, str] = {"matmul": "dot", "masking": "indexing", "edge_blocks": "indexing"}

# Default tolerances (atol, rtol) per output dtype; exact for integers and bool.
DEFAULT_TOLERANCE: dict[str, tuple[float, float]] = {
    "float32": (1e-5, 1e-5),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1.6e-2),
    "float64": (1e-12, 1e-12),
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One conformance case.

    Attributes:
      name: unique id, ``"<module>/<case>"`` (e.g. ``"elementwise/add_f32"``).
      fn: ``fn(pallas_call, *args) -> outputs``; a plain-JAX program that calls the
        ``pallas_call`` it is given (never ``pl.pallas_call`` directly).
      inputs: ``inputs(rng) -> tuple`` of arrays, from a ``numpy.random.Generator``
        seeded with ``seed``.
      reference: ``reference(*args) -> outputs`` in plain JAX (no Pallas).
      tags: capability tags the case needs (all must be claimed).
      tolerance: ``{dtype name: (atol, rtol)}`` overriding :data:`DEFAULT_TOLERANCE`.
      seed: the seed of the input generator.
      description: one line for the report.
    """

    name: str
    fn: Callable[..., Any]
    inputs: Callable[[np.random.Generator], tuple]
    reference: Callable[..., Any]
    tags: frozenset[str]
    tolerance: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    seed: int = 0
    description: str = ""

    def make_inputs(self) -> tuple:
        args = self.inputs(np.random.default_rng(self.seed))
        return tuple(jax.tree_util.tree_map(jnp.asarray, a) for a in args)

    def tolerance_for(self, dtype) -> tuple[float, float]:
        name = jnp.dtype(dtype).name
        if name in self.tolerance:
            return self.tolerance[name]
        if "*" in self.tolerance:
            return self.tolerance["*"]
        return DEFAULT_TOLERANCE.get(name, (0.0, 0.0))


_CASES: dict[str, Case] = {}


def register(c: Case) -> Case:
    """Adds a case to the catalogue (names are unique; tags must be known)."""
    unknown = set(c.tags) - set(TAGS)
    if unknown:
        raise ValueError(f"case {c.name!r} has unknown tags {sorted(unknown)}")
    if not c.tags:
        raise ValueError(f"case {c.name!r} has no tags")
    if c.name in _CASES:
        raise ValueError(f"duplicate conformance case {c.name!r}")
    _CASES[c.name] = c
    return c


def case(name: str, *, tags: Iterable[str], inputs: Callable, reference: Callable,
         tolerance: dict | None = None, seed: int = 0, description: str = ""):
    """Decorator registering ``fn(pallas_call, *args)`` as a case (see module docstring)."""

    def deco(fn):
        register(Case(name=name, fn=fn, inputs=inputs, reference=reference,
                      tags=frozenset(tags), tolerance=dict(tolerance or {}), seed=seed,
                      description=description or (fn.__doc__ or "").strip().split("\n")[0]))
        return fn

    return deco


def registered_cases() -> list[Case]:
    """The cases registered so far, sorted by name (a case module registers its cases when
    it is imported; :func:`pallas_conformance.catalogue.all_cases` imports them all)."""
    return [_CASES[k] for k in sorted(_CASES)]


def registered_case(name: str) -> Case:
    """The registered case called ``name`` (``KeyError`` if there is none)."""
    return _CASES[name]


# ------------------------------------------------------------------------------------
# Helpers for writing cases.


def call_options(pallas_call) -> dict:
    """The keyword arguments the suite bound a case's ``pallas_call`` to:
    ``{"interpret": True}`` at level ``interpret``, ``{"backend": NAME}`` at a backend's
    levels. For cases that build a kernel with a backend's own entry point (say
    ``plgpu.kernel`` over a mesh of warpgroups) in the same mode."""
    return dict(getattr(pallas_call, "keywords", {}))


def sds(shape, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))


def sds_like(x, dtype=None) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(x.shape), jnp.dtype(dtype or x.dtype))


def randn(rng: np.random.Generator, shape, dtype=np.float32, scale: float = 1.0):
    """Normal samples, rounded to ``dtype`` (bool and integers get their own ranges)."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.bool_:
        return jnp.asarray(rng.random(shape) < 0.5)
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        lo, hi = max(int(info.min), -100), min(int(info.max), 100)
        return jnp.asarray(rng.integers(lo, hi + 1, size=shape), dtype=dtype)
    return jnp.asarray(rng.standard_normal(shape) * scale, dtype=jnp.float32).astype(dtype)


def uniform(rng: np.random.Generator, shape, lo, hi, dtype=np.float32):
    return jnp.asarray(rng.uniform(lo, hi, size=shape), dtype=jnp.float32).astype(dtype)


def dtype_tags(*dtypes) -> set[str]:
    """The extra capability tags that operands of these dtypes need."""
    tags = set()
    for d in dtypes:
        name = jnp.dtype(d).name
        tag = {"bfloat16": "bf16", "float16": "f16", "int8": "int8", "uint32": "uint32",
               "bool": "bool", "float8_e4m3fn": "float8", "float8_e5m2": "float8"}.get(name)
        if tag:
            tags.add(tag)
    return tags


def short(dtype) -> str:
    return {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int8": "i8",
            "int32": "i32", "uint32": "u32", "bool": "bool", "float8_e4m3fn": "f8e4m3fn",
            "float8_e5m2": "f8e5m2"}[jnp.dtype(dtype).name]
