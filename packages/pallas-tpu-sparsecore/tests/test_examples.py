"""The SparseCore examples in ``examples/``: the embedding lookup and its gradient (a
scatter-add with repeated ids) match plain JAX in the interpreter, and lower for TPU to
SparseCore kernels with indexed DMAs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pallas_tpu.inspect import op_names

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _load(name):
    path = EXAMPLES / f"{name}.py"
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    spec = importlib.util.spec_from_file_location(f"pallas_sc_example_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_embedding_lookup(lower_tpu):
    ex = _load("sparsecore_embedding")
    table, ids, _ = ex.inputs(vocab=128, batch=64)
    got = ex.embedding_lookup(table, ids, interpret=True)
    np.testing.assert_array_equal(got, ex.lookup_reference(table, ids))
    _, (m,) = lower_tpu(ex.embedding_lookup, table, ids)
    assert op_names(m).count("tpu.enqueue_indirect_dma") == 1
    assert "#tpu.core_type<sc_vector_subcore>" in str(m)


def test_embedding_grad_sums_repeated_ids(lower_tpu):
    ex = _load("sparsecore_embedding")
    _, ids, grads = ex.inputs(vocab=64, batch=32)
    ids = ids.at[:8].set(5)  # one row receives eight gradients
    got = ex.embedding_grad(grads, ids, 64, interpret=True)
    np.testing.assert_allclose(got, ex.grad_reference(grads, ids, 64), rtol=1e-6, atol=1e-6)
    _, (m,) = lower_tpu(lambda g, i: ex.embedding_grad(g, i, 64), grads, ids)
    text = str(m)
    assert op_names(m).count("tpu.enqueue_indirect_dma") == 1 and "add = true" in text
    assert "offset_filter" in text


