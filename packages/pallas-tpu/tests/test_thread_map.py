"""``pallas_tpu.interpret.thread_map``: its keywords and its argument checks.

(That the threads run at once is in ``test_interpret_mode.py``; under an eight-device
``shard_map``, with ``device_id``, in ``test_interpret_devices.py``.)
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_tpu.interpret import thread_map


def _raise_if(pred, message="boom"):
    """An ``io_callback`` body that raises ``ValueError(message)`` when ``pred``."""
    def cb(p):
        if bool(p):
            raise ValueError(message)
    jax.experimental.io_callback(cb, (), pred, ordered=True)


def _callback_eqns(closed):
    return [e for e in closed.jaxpr.eqns if e.primitive.name == "io_callback"]


# -- use_ordered_callback ------------------------------------------------------------------

@pytest.mark.parametrize("ordered", [False, True])
def test_use_ordered_callback_makes_the_threads_callback_an_ordered_effect(ordered):
    def f(i, token):
        return token

    closed = jax.make_jaxpr(lambda: thread_map(
        f, 2, jnp.int32(0), use_ordered_callback=ordered))()
    (eqn,) = _callback_eqns(closed)
    assert eqn.params["ordered"] is ordered
    assert any("Ordered" in type(e).__name__ for e in closed.effects) is ordered


def test_an_ordered_thread_map_runs_between_the_callers_ordered_callbacks():
    log, lock = [], threading.Lock()

    def note(what):
        with lock:
            log.append(str(what))

    def f(i, token):
        jax.experimental.io_callback(lambda i: note(f"thread {int(i)}"), (), i,
                                     ordered=True)
        return token

    @jax.jit
    def g():
        jax.experimental.io_callback(lambda: note("before"), (), ordered=True)
        token = thread_map(f, 3, jnp.int32(0), use_ordered_callback=True)
        jax.experimental.io_callback(lambda: note("after"), (), ordered=True)
        return token

    jax.block_until_ready(g())
    jax.effects_barrier()
    assert log[0] == "before" and log[-1] == "after", log
    assert sorted(log[1:-1]) == ["thread 0", "thread 1", "thread 2"], log


# -- on_exception --------------------------------------------------------------------------

def test_on_exception_is_called_once_with_the_first_error_and_device_id():
    calls = []

    def f(i, token):
        _raise_if(i >= 0, "boom from a thread")  # every thread raises
        return token

    with pytest.raises(Exception, match="boom from a thread"):
        jax.block_until_ready(thread_map(
            f, 4, jnp.int32(0), device_id=5,
            on_exception=lambda e, **kw: calls.append((e, kw))))
    assert len(calls) == 1, calls
    error, kw = calls[0]
    assert kw == {"device_id": 5}
    assert "boom from a thread" in str(error)
    assert any("of 4 on device 5" in n for n in getattr(error, "__notes__", [])), error


def test_on_exception_releases_a_thread_waiting_for_the_one_that_failed():
    """Thread 1 raises while thread 0 waits at a barrier for it: ``on_exception`` runs
    at once (not after every thread has finished, which would never happen), aborts the
    barrier, and the failing thread's error is the one raised."""
    barrier = threading.Barrier(2, timeout=30)  # the timeout only bounds a failing test
    released = threading.Event()
    broken_by_on_exception = []

    def wait():
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            broken_by_on_exception.append(released.is_set())
            raise

    def on_exception(e, *, device_id):
        released.set()
        barrier.abort()

    def f(i, token):
        _raise_if(i == 1, "thread 1 failed")
        jax.experimental.io_callback(wait, (), ordered=True)
        return token

    with pytest.raises(Exception, match="thread 1 failed"):
        jax.block_until_ready(thread_map(f, 2, jnp.int32(0), on_exception=on_exception))
    assert broken_by_on_exception == [True]


def test_an_error_in_on_exception_does_not_hide_the_threads_error():
    def f(i, token):
        _raise_if(i == 0, "the thread's error")
        return token

    def bad_handler(e, *, device_id):
        raise KeyError("handler bug")

    with pytest.raises(Exception, match="the thread's error"):
        jax.block_until_ready(thread_map(f, 2, jnp.int32(0), on_exception=bad_handler))


def test_on_exception_is_not_called_when_no_thread_fails():
    calls = []
    out = thread_map(lambda i, t: t, 3, jnp.int32(4), on_exception=lambda *a, **k:
                     calls.append(a))
    assert int(out) == 4 and calls == []


# -- device_id -----------------------------------------------------------------------------

def test_device_id_may_be_traced_and_reaches_on_exception_as_an_int():
    seen = []

    def f(i, token, x):
        _raise_if(x > 0)
        return token

    @jax.jit
    def g(d, x):
        return thread_map(f, 2, jnp.int32(0), x, device_id=d,
                          on_exception=lambda e, device_id: seen.append(device_id))

    assert int(g(jnp.int32(3), jnp.int32(0))) == 0 and seen == []
    with pytest.raises(Exception, match="boom"):
        jax.block_until_ready(g(jnp.int32(3), jnp.int32(1)))
    assert seen == [3] and type(seen[0]) is int


# -- operands --------------------------------------------------------------------------------

def test_f_may_close_over_traced_values_and_take_pytree_args():
    got, lock = {}, threading.Lock()

    def put(i, v):
        with lock:
            got[int(i)] = float(v)

    @jax.jit
    def g(x, tree):
        def f(i, token, tree):
            jax.experimental.io_callback(put, (), i, x * tree["a"] + tree["b"][0] + i,
                                         ordered=True)
            return token
        return thread_map(f, 3, jnp.int32(1), tree)

    tree = {"a": jnp.float32(2), "b": [jnp.float32(10)]}
    assert int(g(jnp.float32(3), tree)) == 1
    assert got == {0: 16.0, 1: 17.0, 2: 18.0}


def test_one_thread_calls_f_inline_and_returns_its_result():
    out = thread_map(lambda i, token, x: token + x + i, 1, jnp.int32(2), jnp.int32(5))
    assert int(out) == 7


# -- bad input -------------------------------------------------------------------------------

def _noop(i, token):
    return token


@pytest.mark.parametrize("num_threads, error, match", [
    (0, ValueError, "num_threads must be a positive int, got 0"),
    (-2, ValueError, "num_threads must be a positive int, got -2"),
    (2.0, TypeError, "num_threads must be a positive Python int .* got float 2.0"),
    (True, TypeError, "num_threads must be a positive Python int .* got bool True"),
    ("4", TypeError, "num_threads must be a positive Python int .* got str '4'"),
    (jnp.int32(2), TypeError, "num_threads must be a positive Python int"),
])
def test_num_threads_must_be_a_positive_int(num_threads, error, match):
    with pytest.raises(error, match=match):
        thread_map(_noop, num_threads, jnp.int32(0))


def test_numpy_integer_num_threads_is_accepted():
    assert int(thread_map(_noop, np.int64(2), jnp.int32(3))) == 3


def test_bad_f_token_ordered_device_id_and_on_exception_are_rejected_by_name():
    tok = jnp.int32(0)
    with pytest.raises(TypeError, match="f must be callable"):
        thread_map(3, 2, tok)
    with pytest.raises(TypeError, match=r"token must be an integer scalar .* got "
                                        r"ArrayImpl of shape \(2,\) and dtype int32"):
        thread_map(_noop, 2, jnp.zeros(2, jnp.int32))
    with pytest.raises(TypeError, match="token must be an integer scalar .*float32"):
        thread_map(_noop, 2, jnp.float32(0))
    with pytest.raises(TypeError, match="use_ordered_callback must be a bool, got str"):
        thread_map(_noop, 2, tok, use_ordered_callback="yes")
    with pytest.raises(TypeError, match=r"device_id must be an integer scalar .*, or "
                                        r"None, got ArrayImpl of shape \(2,\)"):
        thread_map(_noop, 2, tok, device_id=jnp.arange(2))
    with pytest.raises(TypeError, match="device_id must be .* got float 1.5"):
        thread_map(_noop, 2, tok, device_id=1.5)
    with pytest.raises(ValueError, match="device_id must be >= 0, got -1"):
        thread_map(_noop, 2, tok, device_id=-1)
    with pytest.raises(TypeError, match="on_exception must be callable"):
        thread_map(_noop, 2, tok, on_exception="ignore")
