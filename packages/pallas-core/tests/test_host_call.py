"""`pallas.plugins.host_call`: a host callback handed numpy operands, for interpret modes
whose simulated devices wait for one another inside their callbacks."""

import jax
import jax.numpy as jnp
import numpy as np

from pallas.plugins import host_call, host_call_p


def test_the_callback_gets_numpy_operands_and_returns_the_declared_results():
    seen = []

    def fn(x, y):
        seen.append((type(x), type(y)))
        return [x * 2 + y, np.asarray(x.sum(), np.float32)]

    x = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    out, total = jax.jit(lambda x: host_call(
        fn, [jax.ShapeDtypeStruct((2, 3), jnp.float32), jax.ShapeDtypeStruct((), jnp.float32)],
        x, jnp.float32(1)))(x)
    np.testing.assert_array_equal(out, np.arange(6).reshape(2, 3) * 2 + 1)
    assert float(total) == 15.0
    assert seen == [(np.ndarray, np.ndarray)]


def test_an_unused_call_is_kept_and_runs_eagerly_too():
    calls = []

    def fn(x):
        calls.append(int(x))
        return [x]

    def f(x):
        host_call(fn, [jax.ShapeDtypeStruct((), jnp.int32)], x)  # result unused
        return x + 1

    jaxpr = jax.make_jaxpr(f)(jnp.int32(3))
    assert any(e.primitive is host_call_p for e in jaxpr.eqns)
    assert int(jax.jit(f)(jnp.int32(3))) == 4
    (y,) = host_call(fn, [jax.ShapeDtypeStruct((), jnp.int32)], jnp.int32(7))
    assert int(y) == 7
    assert calls == [3, 7]


def test_it_runs_once_per_device_under_shard_map():
    # (pallas-tpu's and pallas-mosaic-gpu's device tests run it over 8 and 4 devices)
    devices = jax.devices()
    mesh = jax.make_mesh((len(devices),), ("x",), devices=devices)
    calls = []

    def fn(x):
        calls.append(x.copy())
        return [x + 10]

    def body(x):
        return host_call(fn, [jax.ShapeDtypeStruct(x.shape, x.dtype)], x)[0]

    f = jax.shard_map(body, mesh=mesh, in_specs=jax.P("x"), out_specs=jax.P("x"))
    x = jax.device_put(jnp.arange(2 * len(devices), dtype=jnp.int32),
                       jax.NamedSharding(mesh, jax.P("x")))
    np.testing.assert_array_equal(jax.jit(f)(x), np.arange(2 * len(devices)) + 10)
    assert len(calls) == len(devices)
