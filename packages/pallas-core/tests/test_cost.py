"""``pl.estimate_cost`` counts a jaxpr with upstream's cost model, figure for figure."""

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import pallas as pl

SDS = jax.ShapeDtypeStruct
F32 = jnp.float32


def test_elementwise_ops_cost_a_flop_per_element_and_transcendentals_one_each():
    cost = pl.estimate_cost(lambda x, y: jnp.exp(x + y), SDS((10,), F32), SDS((10,), F32))
    assert (cost.flops, cost.transcendentals) == (10, 10)
    assert cost.bytes_accessed == 4 * 30  # two inputs and the output


def test_a_matmul_costs_two_flops_per_multiply_add_in_exact_integers():
    m, k, n = 400_000, 800_000, 900_000  # beyond float64's exact integers
    cost = pl.estimate_cost(lambda a, b: a @ b, SDS((m, k), jnp.bfloat16),
                            SDS((k, n), jnp.bfloat16))
    assert cost.flops == 2 * m * k * n
    assert cost.bytes_accessed == 2 * (m * k + k * n + m * n)


def test_batch_dimensions_are_counted_once():
    b, m, k, n = 7, 37, 91, 23
    cost = pl.estimate_cost(jnp.matmul, SDS((b, m, k), F32), SDS((b, k, n), F32))
    assert cost.flops == 2 * b * m * k * n


@pytest.mark.parametrize("power, per_element", [(0, 0), (1, 0), (2, 2), (7, 5), (8, 4), (9, 5)])
def test_integer_pow_costs_a_square_and_multiply_chain(power, per_element):
    cost = pl.estimate_cost(lambda x: lax.integer_pow(x, power), SDS((10,), F32))
    assert cost.flops == 10 * per_element
    assert cost.transcendentals == 0


def test_reductions_and_data_movement_cost_nothing():
    cost = pl.estimate_cost(lambda x: jnp.sum(x.T.reshape(-1)), SDS((8, 4), F32))
    assert (cost.flops, cost.transcendentals) == (0, 0)
    assert cost.bytes_accessed == 4 * (32 + 1)


def test_the_bodies_of_jit_and_custom_vjp_are_counted():
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x) * 2.0
    f.defvjp(lambda x: (f(x), x), lambda x, g: (g * jnp.cos(x),))
    cost = pl.estimate_cost(jax.jit(lambda x: f(x) + 1.0), SDS((16,), F32))
    assert (cost.flops, cost.transcendentals) == (32, 16)


def test_pytrees_of_arguments_count_every_leaf():
    cost = pl.estimate_cost(lambda p: p["a"] * p["b"], {"a": SDS((4,), F32), "b": SDS((4,), F32)})
    assert cost.flops == 4
    assert cost.bytes_accessed == 4 * 12
