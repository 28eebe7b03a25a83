"""The loop's live profile (both prompt sets in turns, servers interleaved) with 20 derivation + 20 held-out
HumanEval prompts, for vLLM's advised ngram:8 against off: does the error shrink with more prompts?

    PYTHONPATH=src .venv/bin/python docs/results/scaleout/epyc-zen5-avx512-2c/2026-12-06-profile-20x20/profile20.py

Writes results.jsonl (two profile rows), profile-vllm-mixed.jsonl and the prompt files beside this script."""
from pathlib import Path

from adaspec.engines.config import EngineConfig
from adaspec.engines.results import Results
from adaspec.engines.scaleout import _live_profile, parse_args, split_prompts

HERE = Path(__file__).parent
hf = Path.home() / ".cache/adaspec/hf"
s = parse_args(["--out", str(HERE), "--engines", "vllm", "--vllm-venv", ".peers/vllm",
                "--vllm-target", str(hf / "qwen2.5-coder-1.5b-instruct"),
                "--vllm-draft", str(hf / "qwen2.5-coder-0.5b-instruct"), "--vllm-kv-gib", "2",
                "--derive-prompts", "20", "--heldout-prompts", "20", "--max-tokens", "64", "--settle", "30", "--split", "first"])
derive, heldout = split_prompts(s.workload, s.derive_prompts, s.heldout_prompts, s.out, s.split)
results = Results(HERE / "results.jsonl")
_live_profile(s, EngineConfig.parse("vllm", "ngram:8"), {"derive": derive, "heldout": heldout}, results, print)
for r in results.rows("profile"):
    print(r["phase"], r["speedup"], r["ci95"], r["prompts"])
