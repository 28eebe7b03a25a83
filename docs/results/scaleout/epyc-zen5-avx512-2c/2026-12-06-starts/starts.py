"""Does vLLM's plain decoding speed change from one server start to the next, and stay put within one?

    PYTHONPATH=src .venv/bin/python docs/results/scaleout/epyc-zen5-avx512-2c/2026-12-06-starts/starts.py [STARTS] [CONFIGS]

Starts each configuration (default ``off``) STARTS times (default 4), alternating configurations, and measures the
loop's 4 held-out HumanEval prompts at one client, 64 tokens, twice per start (rounds a and b); rows go to
``starts.jsonl`` beside this file (resumable: a measured (start, config, round) is skipped)."""
import sys
from pathlib import Path

from adaspec.engines.config import EngineConfig
from adaspec.engines.measure import Phase, measure_levels
from adaspec.engines.results import Results
from adaspec.engines.scaleout import engine_process, parse_args

HERE = Path(__file__).parent
PROMPTS = HERE.parent / "2026-12-05" / "heldout.jsonl"
starts = int(sys.argv[1]) if len(sys.argv) > 1 else 4
configs = (sys.argv[2] if len(sys.argv) > 2 else "off").split(",")
s = parse_args(["--out", str(HERE), "--engines", "vllm", "--vllm-venv", ".peers/vllm",
                "--vllm-target", str(Path.home() / ".cache/adaspec/hf/qwen2.5-coder-1.5b-instruct"),
                "--vllm-draft", str(Path.home() / ".cache/adaspec/hf/qwen2.5-coder-0.5b-instruct"),
                "--vllm-kv-gib", "2", "--concurrency", "1"])
results = Results(HERE / "starts.jsonl")
for i in range(starts):
    for spec in configs:
        cfg = EngineConfig.parse("vllm", spec)
        phases = [Phase(f"start{i}{r}", str(PROMPTS), 4, 64, [1], []) for r in "ab"]
        if all(not __import__("adaspec.engines.measure", fromlist=["pending"]).pending(p, cfg, results) for p in phases):
            continue
        with engine_process(s, cfg) as proc:
            print(f"start {i} {cfg.label}: ready after {proc.ready_s:.0f} s", flush=True)
            for p in phases:
                measure_levels(proc, cfg, p, results)
