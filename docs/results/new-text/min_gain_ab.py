"""The goodput controller's margin over plain decoding (``GoodputConfig.min_gain``: speculate only where the predicted
goodput is at least min_gain × plain's) at 1.0 (the default), 1.05 and 1.10, alternated per prompt with plain
decoding in one process: make demo's prompt, the last 3 Spec-Bench coding and writing prompts, 2 GSM8K and 2 code-edit
prompts, 128 tokens, greedy, the default drafter, two passes (the arms' order rotates per prompt and pass). Each
request reads and writes its own suffix-cache partition, so no arm drafts from another's answers.

    PYTHONPATH=src python docs/results/new-text/min_gain_ab.py rows.jsonl     # from the repository root, quiet
    python docs/results/new-text/min_gain_ab.py --summary rows.jsonl
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
from pathlib import Path

ARMS = {"mg1.00": 1.0, "mg1.05": 1.05, "mg1.10": 1.10}
DEMO = "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring and type hints."


WORKLOADS = (("specbench:coding", -3), ("specbench:writing", -3), ("gsm8k", 2), ("code-edit", 2))


def run(out_path: str, arms: dict[str, dict] | None = None, workloads=WORKLOADS, forget: bool = False,
        demo: bool = True) -> None:
    """The A/B: ``arms`` maps an arm's name to its GoodputController keyword arguments (default: ``min_gain`` per
    :data:`ARMS`), and optionally ``catch_up``: the draft models' bounded catch-up in that arm
    (``ModelDrafter.catch_up``, default None), and ``draft``: another GGUF file for that arm's draft model (its own
    drafter of the default kind around it; default: the default draft); ``workloads`` lists (workload, take) with take < 0 for the last prompts, > 0 for the first, a
    (start, stop) pair for a slice;
    ``forget`` empties every draft model's cache before each request (no arm finds the prompt fed by another);
    ``demo``: make demo's prompt first."""
    from adaspec.api import SpeculativeLM, load_model, make_drafter, set_threads
    from adaspec.controllers import GoodputController
    from adaspec.defaults import DEFAULT_DRAFTER
    from adaspec.drafters.multi import model_drafters
    from adaspec.engine import GenerationConfig, SpeculativeEngine
    from adaspec.workloads import load_workload

    arms = arms if arms is not None else {arm: {"min_gain": g} for arm, g in ARMS.items()}
    catch_up = {arm: kw.get("catch_up") for arm, kw in arms.items()}
    draft_files = {arm: kw.get("draft") for arm, kw in arms.items()}
    arms = {arm: {k: v for k, v in kw.items() if k not in ("catch_up", "draft")} for arm, kw in arms.items()}
    set_threads(2)
    target = load_model("qwen2.5-coder-1.5b-instruct", backend="ik")
    lm = SpeculativeLM(target, None, None)
    drafter = make_drafter(DEFAULT_DRAFTER, target, backend="ik")

    def arm_drafter(arm: str):
        if draft_files.get(arm) is None:
            return drafter
        from adaspec.backends.select import make_gguf_backend
        from adaspec.drafters import ModelDrafter
        from adaspec.models.registry import DEFAULT_DRAFT

        model = ModelDrafter(make_gguf_backend("ik", Path(draft_files[arm]), threads=2))
        return make_drafter(DEFAULT_DRAFTER, target, backend="ik", reuse={DEFAULT_DRAFT: model})

    drafters = {arm: arm_drafter(arm) for arm in arms}
    engines = {arm: SpeculativeEngine(target.backend, drafters[arm], GoodputController(**kw),
                                      tokenizer=target.tokenizer) for arm, kw in arms.items()}
    engines["plain"] = SpeculativeEngine(target.backend, None, None, tokenizer=target.tokenizer)
    for engine in engines.values():
        engine.warmup()
    prompts = [("demo", [{"role": "user", "content": DEMO}])] if demo else []
    for workload, take in workloads:
        chosen = load_workload(workload)
        chosen = chosen[slice(*take)] if isinstance(take, tuple) else chosen[take:] if take < 0 else chosen[:take]
        prompts += [(workload, list(p.messages) if p.messages else [{"role": "user", "content": p.text}])
                    for p in chosen]
    spec = list(arms)
    with open(out_path, "a") as out:
        for rnd in range(2):
            for i, (family, messages) in enumerate(prompts):
                ids = lm.encode(messages, chat=True)
                shift = (i + rnd) % len(spec)
                for arm in ["plain", *spec[shift:], *spec[:shift]]:
                    for d in model_drafters(drafters.get(arm, drafter)).values():
                        d.catch_up = catch_up.get(arm)
                        if forget:
                            d.forget()
                    r = engines[arm].generate(ids, GenerationConfig(max_new_tokens=128,
                                                                    cache_partition=f"{arm}-{rnd}-{i}"))
                    s = r.stats
                    row = dict(rnd=rnd, i=i, family=family, arm=arm, prompt_len=len(ids), new_tokens=s.new_tokens,
                               decode_tps=(s.new_tokens - 1) / (s.total_ms - s.prefill_ms) * 1e3,
                               drafted_steps=sum(1 for st in s.steps if st.drafted), steps=len(s.steps),
                               tokens=r.token_ids)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print({k: v for k, v in row.items() if k != "tokens"}, flush=True)


def summary(path: str) -> None:
    """Per family and arm: the geometric mean over prompts and passes of decode tokens/s ÷ plain's on the same prompt
    and pass, drafted steps, and whether the tokens equal plain's."""
    rows = [json.loads(line) for line in open(path)]
    plain = {(r["rnd"], r["i"]): r for r in rows if r["arm"] == "plain"}
    ratios: dict[tuple, list] = collections.defaultdict(list)
    drafted: dict[tuple, list] = collections.defaultdict(list)
    same: collections.Counter = collections.Counter()
    for r in rows:
        p = plain.get((r["rnd"], r["i"]))
        if r["arm"] == "plain" or p is None:
            continue
        for key in ((r["family"], r["arm"]), ("all", r["arm"])):
            ratios[key].append(r["decode_tps"] / p["decode_tps"])
            drafted[key].append(r["drafted_steps"] / r["steps"])
            same[key] += r["tokens"] == p["tokens"]
    print("| family | arm | requests | decode ÷ plain (geo. mean) | range | drafted steps | identical to plain |")
    print("|---|---|---:|---:|---|---:|---:|")
    for (family, arm), xs in sorted(ratios.items(), key=lambda kv: (kv[0][0] == "all", kv[0])):
        print(f"| {family} | {arm} | {len(xs)} | {statistics.geometric_mean(xs):.3f} | {min(xs):.2f}–{max(xs):.2f} | "
              f"{statistics.mean(drafted[(family, arm)]):.0%} | {same[(family, arm)]}/{len(xs)} |")


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        summary(sys.argv[2])
    else:
        run(sys.argv[1])
