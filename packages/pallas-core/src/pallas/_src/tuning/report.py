"""The report of one search: every config, what became of it, and the choice."""

from __future__ import annotations

import dataclasses
from typing import Any

from pallas._src.tuning.keys import CacheKey, config_json


@dataclasses.dataclass
class ConfigResult:
    """One config in a search.

    Attributes:
      index: its position in the config list (ties break toward the lower index).
      config: the keyword arguments.
      status: ``"chosen"``, ``"ranked"`` (timed or modelled, not chosen), ``"pruned"``
        (dropped before timing) or ``"failed"`` (raised while running).
      reason: why it was pruned or failed.
      times: the timed runs' seconds (measured searches).
      median: the median of ``times``.
      estimate: the static model's cost (compare, do not read as seconds).
      figures: the figures the model used: per kernel, the jaxpr's and the compiler's.
    """

    index: int
    config: dict
    status: str = "ranked"
    reason: str = ""
    times: list = dataclasses.field(default_factory=list)
    median: float | None = None
    estimate: float | None = None
    figures: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TuningReport:
    """What a search did.

    Attributes:
      function: the tuned function's name.
      key: the cache key the winner is filed under.
      method: ``"measured"`` (timed on the device), ``"model"`` (ranked by the static
        model: no device), ``"cache"`` (an earlier search's winner) or ``"default"``
        (the first config: tuning off, or only cached winners allowed and none found).
      chosen: the winning config.
      results: every config's :class:`ConfigResult`, in config order.
      seconds: how long the search took (tracing, pruning, timing).
      why_model: for ``method="model"``, why nothing was timed.
      model_agreement: for a measured search, Kendall's tau between the model's ranking
        and the measured one (1: same order, -1: reversed), ``None`` where not computed.
    """

    function: str
    key: CacheKey | None
    method: str
    chosen: dict
    results: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    why_model: str = ""
    model_agreement: float | None = None

    @property
    def pruned(self) -> list[ConfigResult]:
        """The configs dropped before timing, each with its reason."""
        return [r for r in self.results if r.status == "pruned"]

    def details(self) -> dict[str, Any]:
        """What the cache keeps beside the winner."""
        return {"results": [{"config": config_json(r.config), "status": r.status,
                             "reason": r.reason, "median": r.median, "estimate": r.estimate}
                            for r in self.results],
                "seconds": self.seconds, "why_model": self.why_model,
                "model_agreement": self.model_agreement}

    def __str__(self) -> str:
        head = f"tuning {self.function}: {self.method}"
        if self.method == "model":
            head += f" (a static model, not measured: {self.why_model})"
        lines = [head, f"  chosen: {config_json(self.chosen)}"]
        for r in self.results:
            figure = (f"median {r.median * 1e3:.3f} ms" if r.median is not None else
                      f"model {r.estimate:.3g}" if r.estimate is not None else "")
            lines.append(f"  [{r.index}] {r.status:7} {config_json(r.config)} {figure}"
                         + (f" -- {r.reason}" if r.reason else ""))
        if self.model_agreement is not None:
            lines.append(f"  model agreement with measurements (Kendall tau): "
                         f"{self.model_agreement:+.2f}")
        if self.seconds:
            lines.append(f"  search: {self.seconds:.2f} s")
        return "\n".join(lines)
