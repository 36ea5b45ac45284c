"""Autotuning: block sizes and launch parameters chosen by measurement, cached across runs.

Not an upstream name (upstream Pallas has no autotuner). Decorate a function that builds
its ``pallas_call``s from tuning parameters::

    @pallas.tuning.autotune([{"block": 128}, {"block": 256}, {"block": 512}])
    def matmul(x, y, *, block): ...

Called with arrays, it times every config on the device and runs the fastest; the winner
is cached (SQLite, see :class:`TuningCache`) per argument shapes and dtypes, backend and
device kind. Under ``jit`` it uses the cache; :func:`tune` fills it ahead of time. Where
the device is not at hand (cross compiling, an emulated device) a static model ranks the
configs from compile-level figures. See the docs' "Autotuning" page.
"""

from pallas._src.tuning.autotune import (
    ENV_MODE,
    Autotuned,
    AutotuneWarning,
    autotune,
    example_arrays,
    mode,
    tune,
)
from pallas._src.tuning.cache import ENV_CACHE, TuningCache, default_path, user_cache_dir
from pallas._src.tuning.devices import ENV_EMULATE, SPECS, DeviceSpec, Target, current_target
from pallas._src.tuning.figures import FIELDS, register_figures, unregister_figures
from pallas._src.tuning.keys import CacheKey
from pallas._src.tuning.model import kendall_tau
from pallas._src.tuning.report import ConfigResult, TuningReport
from pallas._src.tuning.search import TuningError
from pallas._src.tuning.timer import Timer

for _cls in (AutotuneWarning, Autotuned, TuningCache, Target, DeviceSpec, CacheKey,
             ConfigResult, TuningReport, TuningError, Timer):
    _cls.__module__ = "pallas.tuning"
del _cls

__all__ = [
    "ENV_CACHE", "ENV_EMULATE", "ENV_MODE", "FIELDS", "SPECS", "AutotuneWarning",
    "Autotuned", "CacheKey", "ConfigResult", "DeviceSpec", "Target", "Timer",
    "TuningCache", "TuningError", "TuningReport", "autotune", "current_target",
    "default_path", "example_arrays", "kendall_tau", "mode", "register_figures", "tune",
    "unregister_figures", "user_cache_dir",
]
