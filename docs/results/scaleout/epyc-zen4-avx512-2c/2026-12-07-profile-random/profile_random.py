"""The loop's live profile (both prompt sets in turns, servers interleaved) for an engine's ngram:8 against off, with
derivation and held-out prompts drawn from one random order of all 82 HumanEval prompts (41 + 41), not consecutive
slices: is the profile's error then the sampling error its interval states?

    PYTHONPATH=src .venv/bin/python docs/results/scaleout/epyc-zen4-avx512-2c/2026-12-07-profile-random/profile_random.py [N] [vllm|llamacpp]

Writes results.jsonl (two profile rows per engine), profile-ENGINE-mixed.jsonl and the prompt files beside this
script. The same measurement is now `make scaleout-profile` (`python -m adaspec.engines.scaleout --profile-only`)."""
import sys
from pathlib import Path

from adaspec.engines.config import EngineConfig
from adaspec.engines.results import Results
from adaspec.engines.scaleout import _live_profile, parse_args, split_prompts

HERE = Path(__file__).parent
hf = Path.home() / ".cache/adaspec/hf"
n = int(sys.argv[1]) if len(sys.argv) > 1 else 41
engine = sys.argv[2] if len(sys.argv) > 2 else "vllm"
server = next((p for p in Path(".peers/llama-server").rglob("llama-server") if p.is_file()), None)
s = parse_args(["--out", str(HERE), "--engines", engine, "--vllm-venv", ".peers/vllm",
                "--vllm-target", str(hf / "qwen2.5-coder-1.5b-instruct"),
                "--vllm-draft", str(hf / "qwen2.5-coder-0.5b-instruct"), "--vllm-kv-gib", "2",
                "--derive-prompts", str(n), "--heldout-prompts", str(n), "--max-tokens", "64", "--settle", "30",
                "--split", "random", "--split-seed", "0", "--llama-server", str(server)])
derive, heldout = split_prompts(s.workload, s.derive_prompts, s.heldout_prompts, s.out, s.split, s.split_seed)
results = Results(HERE / "results.jsonl")
_live_profile(s, EngineConfig.parse(engine, "ngram:8"), {"derive": derive, "heldout": heldout}, results, print)
for r in results.rows("profile"):
    print(r["phase"], r["speedup"], r["ci95"], r["prompts"], "precision", r.get("precision"),
          "needed for 10%", r.get("prompts_needed"))
