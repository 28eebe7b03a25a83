"""n-gram K 8 against the advised draft model K 8 on vLLM, side by side, requests interleaved (one client).

    PYTHONPATH=src .venv/bin/python docs/results/scaleout/epyc-zen5-avx512-2c/2026-12-06-vllm-settled/methods.py

Starts vLLM with ``ngram:8`` (the "speculative" arm) and ``draft:8`` (the "baseline" arm) beside each other and runs
``adaspec bench --endpoint`` on this run's 8 held-out prompts, 64 tokens, 2 rounds, 20 s settling, interleaved;
rows in methods.jsonl."""
import subprocess
import sys
from pathlib import Path

from adaspec.engines.config import EngineConfig
from adaspec.engines.scaleout import PORTS, engine_process, parse_args

HERE = Path(__file__).parent
s = parse_args(["--out", str(HERE / "methods-logs"), "--engines", "vllm", "--vllm-venv", ".peers/vllm",
                "--vllm-target", str(Path.home() / ".cache/adaspec/hf/qwen2.5-coder-1.5b-instruct"),
                "--vllm-draft", str(Path.home() / ".cache/adaspec/hf/qwen2.5-coder-0.5b-instruct"),
                "--vllm-kv-gib", "2", "--concurrency", "1"])
a = engine_process(s, EngineConfig.parse("vllm", "ngram:8"))
b = engine_process(s, EngineConfig.parse("vllm", "draft:8"), port=PORTS["vllm"] + 1)
with a, b:
    subprocess.run([sys.executable, "-m", "adaspec", "bench", "--endpoint", a.url, "--baseline", b.url,
                    "--workload", str(HERE / "heldout.jsonl"), "--prompts", "8", "--max-tokens", "64",
                    "--rounds", "2", "--settle", "20", "--interleave", "--out", str(HERE / "methods.jsonl")],
                   check=True)
