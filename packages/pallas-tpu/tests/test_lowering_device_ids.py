"""The Mosaic TPU lowering turns a mesh ``device_id`` into the logical id row-major over
the kernel's mesh axes: from a tuple, from a dict in any key order, and from a dict with
a joint-axis key. Lowered under ``shard_map`` on four CPU devices in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent('''
    import re
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import PartitionSpec as P
    import pallas as pl, pallas_tpu as pltpu
    from pallas_tpu.inspect import mosaic_modules

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ["y", "x"])

    def target(device_id):
        def kernel(x_ref, o_ref, send, recv):
            c = pltpu.make_async_remote_copy(x_ref, o_ref, send, recv, device_id=device_id,
                                             device_id_type=pl.DeviceIdType.MESH)
            c.start()
            c.wait()

        def call(x):
            return pl.pallas_call(
                kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                out_specs=pl.BlockSpec(memory_space=pl.ANY),
                scratch_shapes=[pltpu.SemaphoreType.DMA, pltpu.SemaphoreType.DMA])(x)

        f = jax.jit(jax.shard_map(call, mesh=mesh, in_specs=P("y", "x"),
                                  out_specs=P("y", "x"), check_vma=False))
        low = f.trace(jnp.zeros((16, 256), jnp.float32)).lower(lowering_platforms=("tpu",))
        text = mosaic_modules(low)[0].operation.get_asm(enable_debug_info=False)
        env, ops = {}, {"muli": int.__mul__, "addi": int.__add__, "remsi": int.__mod__,
                        "divsi": int.__floordiv__}
        for line in text.splitlines():
            if m := re.search(r"(%\\w+) = arith.constant (-?\\d+) : i32", line):
                env[m[1]] = int(m[2])
            elif m := re.search(r"(%\\w+) = arith.(\\w+) (%\\w+), (%\\w+) : i32", line):
                env[m[1]] = ops[m[2]](env[m[3]], env[m[4]])
            elif m := re.search(r"enqueue_dma .*device_id\\((%\\w+)\\)", line):
                return env[m[1]]

    print("ids", target((1, 0)), target({"x": 0, "y": 1}), target({"y": 1, "x": 0}),
          target({("y", "x"): 2}), target({("x", "y"): 1}))
''')


def test_dict_and_joint_axis_device_ids_lower_to_the_right_logical_id():
    """A dict's leaves come in key order ('x' before 'y'): read as mesh coordinates they
    named device 1 instead of 2 on a ('y', 'x') mesh."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # (y=1, x=0) is logical device 2; joint ("x", "y") index 1 is x=0, y=1: device 2 too.
    assert "ids 2 2 2 2 2" in proc.stdout, proc.stdout + proc.stderr
