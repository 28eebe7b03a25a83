"""What one engine run serves: the engine, its speculation method and draft length K.

``method`` is ``off`` (plain decoding), ``ngram`` (prompt lookup: vLLM's ``ngram``, llama-server's
``ngram-simple``) or ``draft`` (a draft model: vLLM's ``draft_model``, llama-server's ``draft-simple``). ``k`` is
the number of speculative tokens per step (vLLM ``num_speculative_tokens``, llama-server
``--spec-draft-n-max``); 0 for ``off``. ``schedule`` (vLLM only) is a draft length per batch size,
``((first, last, K), ...)`` with inclusive ranges from 1 (vLLM's ``num_speculative_tokens_per_batch_size``, "Dynamic
speculative decoding"; each K at most ``k``, 0 = no speculation at that batch size).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from adaspec.errors import ConfigError

ENGINES = ("vllm", "llamacpp")
METHODS = ("off", "ngram", "draft")


@dataclass(frozen=True)
class EngineConfig:
    """One engine configuration. ``label`` (e.g. ``vllm/ngram-k4``) names it in results and logs."""

    engine: str
    method: str = "off"
    k: int = 0
    schedule: tuple[tuple[int, int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")
        if self.method not in METHODS:
            raise ConfigError(f"method must be one of {', '.join(METHODS)}, not {self.method!r}")
        if self.method == "off" and self.k != 0:
            raise ConfigError(f"{self.engine}: method off takes k = 0, not {self.k}")
        if self.method != "off" and not 1 <= self.k <= 16:
            raise ConfigError(f"{self.engine}/{self.method}: k must be 1..16, not {self.k}")
        if self.schedule:
            if self.engine != "vllm" or self.method == "off":
                raise ConfigError("a per-batch-size schedule needs vLLM and a speculative method")
            starts = [a for a, _, _ in self.schedule]
            if starts[0] != 1 or any(not (1 <= a <= b and 0 <= k <= self.k) for a, b, k in self.schedule) or any(
                    b >= a2 for (_, b, _), (a2, _, _) in zip(self.schedule, self.schedule[1:])):
                raise ConfigError(f"schedule {self.schedule} must be sorted, non-overlapping (first, last, K) ranges "
                                  f"from 1 with 0 <= K <= k = {self.k}")

    @property
    def label(self) -> str:
        if self.method == "off":
            return f"{self.engine}/off"
        sched = "@" + ",".join(f"{a}-{b}:{k}" for a, b, k in self.schedule) if self.schedule else ""
        return f"{self.engine}/{self.method}-k{self.k}{sched}"

    @classmethod
    def parse(cls, engine: str, text: str) -> EngineConfig:
        """``off``, ``ngram:4`` or ``draft:3`` (method:K) for ``engine``. Raises ConfigError naming the text."""
        method, _, k = text.strip().partition(":")
        if method == "off" and not k:
            return cls(engine)
        if not k.strip().isdigit():
            raise ConfigError(f"a configuration is off, ngram:K or draft:K, not {text!r}")
        return cls(engine, method, int(k))

    @classmethod
    def from_label(cls, label: str) -> EngineConfig:
        """The configuration a :attr:`label` names (``llamacpp/off``, ``vllm/ngram-k8``, ``vllm/ngram-k8@1-1:8,2-4:3``).
        Raises ConfigError naming the label."""
        m = re.fullmatch(r"(\w+)/(?:off|(\w+)-k(\d+)(?:@((?:\d+-\d+:\d+,?)+))?)", label.strip())
        if not m:
            raise ConfigError(f"not a configuration label (ENGINE/off, ENGINE/METHOD-kK[@FIRST-LAST:K,...]): {label!r}")
        engine, method, k, sched = m.groups()
        if method is None:
            return cls(engine)
        schedule = tuple(tuple(int(x) for x in re.split(r"[-:]", part)) for part in sched.split(",") if part) \
            if sched else ()
        return cls(engine, method, int(k), schedule)
