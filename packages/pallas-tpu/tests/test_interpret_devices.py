"""TPU interpret mode on several devices under ``shard_map``.

Runs in a subprocess: ``--xla_force_host_platform_device_count`` must be set before JAX
initialises its CPU backend, which in this process has already happened.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

_RING = textwrap.dedent('''
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import pallas as pl
    import pallas_tpu as pltpu

    n = jax.device_count()
    assert n == 8, jax.devices()
    mesh = jax.make_mesh((n,), ("x",))
    rows = 64  # 128 KiB of f32 per device: XLA hands such operands over asynchronously

    def kernel(x_ref, o_ref, send, recv):
        right = jax.lax.rem(jax.lax.axis_index("x") + 1, n)
        copy = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=(right,),
                                            device_id_type=pl.DeviceIdType.MESH)
        copy.start()
        copy.wait()

    def permute(x):
        return pl.pallas_call(
            kernel, jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA],
            interpret=pltpu.InterpretParams(detect_races=True))(x)

    x = jnp.arange(n * rows * 512, dtype=jnp.float32).reshape(n * rows, 512)
    x = jax.device_put(x, NamedSharding(mesh, P("x")))
    f = jax.jit(jax.shard_map(permute, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))
    np.testing.assert_array_equal(np.asarray(f(x)), np.roll(np.asarray(x), rows, axis=0))
    from pallas_tpu import interpret
    assert not interpret.races.races_found
    print("ok ring")

    from pallas.plugins import get_backend
    from pallas_conformance.races import RACE_CASES, run_race_case
    case = next(c for c in RACE_CASES if c.name == "races/remote_copy_without_semaphore")
    tpu = get_backend("mosaic_tpu")
    print("remote copy race reported:", run_race_case(case, tpu, racy=True))
    print("race-free twin reported:", run_race_case(case, tpu, racy=False))

    import threading
    met, lock = {}, threading.Lock()

    def meet(dev):  # returns once the four threads of device `dev` are all here
        with lock:
            barrier = met.setdefault(int(dev), threading.Barrier(4))
        barrier.wait(timeout=60)

    def threads(x):
        def f(i, token, x):
            dev = x[0, 0].astype(jnp.int32) // (rows * 512)
            jax.experimental.io_callback(meet, (), dev, ordered=True)
            return token
        return x + interpret.thread_map(f, 4, jnp.int32(0), x).astype(x.dtype)

    g = jax.jit(jax.shard_map(threads, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))
    np.testing.assert_array_equal(np.asarray(g(x)), np.asarray(x))
    assert sorted(met) == list(range(n)), sorted(met)
    print("ok thread_map")

    failed_on = []  # device_id names the device whose thread failed

    def boom(dev, i):
        if int(dev) == 5 and int(i) == 2:
            raise ValueError("thread 2 of device 5 failed")

    def failing(x):
        d = jax.lax.axis_index("x")
        def f(i, token, d):
            jax.experimental.io_callback(boom, (), d, i, ordered=True)
            return token
        return x + interpret.thread_map(
            f, 4, jnp.int32(0), d, device_id=d,
            on_exception=lambda e, device_id: failed_on.append(device_id)).astype(x.dtype)

    h = jax.jit(jax.shard_map(failing, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              check_vma=False))
    try:
        jax.block_until_ready(h(x))
        raise AssertionError("no error")
    except Exception as e:
        assert "thread 2 of device 5 failed" in str(e), e
    assert failed_on == [5], failed_on
    print("ok thread_map device_id")
''')


def test_eight_devices_permute_around_a_ring_and_report_a_planted_remote_race():
    """Every device's callback joins one simulation and waits for the others; the
    operands (large enough that XLA hands them over asynchronously) reach the simulation
    without a round trip through a JAX device that the waiting callbacks occupy (which
    used to hang all eight)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8")
    try:
        proc = subprocess.run([sys.executable, "-c", _RING], env=env, capture_output=True,
                              text=True, timeout=240)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the eight devices hung: {e.stdout}\n{e.stderr}") from None
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok ring" in proc.stdout, proc.stdout + proc.stderr
    # The conformance suite's planted remote-copy race (and its twin) on a real ring of
    # eight devices: in the suite's own (one-device) run, the copy goes to itself.
    assert "remote copy race reported: True" in proc.stdout, proc.stdout + proc.stderr
    assert "race-free twin reported: False" in proc.stdout, proc.stdout + proc.stderr
    # thread_map under shard_map: every device's four threads run at once (their host
    # callbacks meet at a barrier per device) with operands XLA hands over asynchronously.
    assert "ok thread_map" in proc.stdout, proc.stdout + proc.stderr
    # ... and device_id names the device whose thread failed (to on_exception).
    assert "ok thread_map device_id" in proc.stdout, proc.stdout + proc.stderr
