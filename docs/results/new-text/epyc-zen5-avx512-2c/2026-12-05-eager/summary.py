"""Old (08f4738) vs new code on the same prompts, from this folder's alternated A/B (block.sh): per workload family,
the mean per-prompt decode speedup of the default (hybrid-suffix/goodput) over plain decoding of the same pass, its
mean K, τ and the share of steps that drafted; and `make demo`'s prompt end to end (generate --compare --json).

    python summary.py [FOLDER]   (default: the files beside it; v1/ and v2/ hold the runs with the eager prefill on)
"""
import collections
import json
import statistics
import sys
from pathlib import Path

here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
M = "hybrid-suffix/goodput"


def family(r):
    return f"{r['workload']}:{r['category']}" if r["workload"] == "specbench" else r["workload"]


cells = collections.defaultdict(list)  # (family, version) -> per-prompt speedups
extra = collections.defaultdict(lambda: collections.defaultdict(list))
same = collections.Counter()
for v in ("old", "new"):
    for p in ("1", "2"):
        f = here / f"newtext-{v}-{p}.jsonl"
        if not f.is_file():
            continue
        rows = [json.loads(line) for line in f.open()]
        plain = {r["prompt_id"]: r for r in rows if r["method"] == "plain"}
        for r in rows:
            if r["method"] != M or r["prompt_id"] not in plain:
                continue
            pl = plain[r["prompt_id"]]
            s = (r["decode_tokens"] / r["decode_ms"]) / (pl["decode_tokens"] / pl["decode_ms"])
            for fam in (family(r), "all"):
                cells[fam, v].append(s)
                extra[fam, v]["k"] += [k for k in r["k_trace"] if k > 0]
                extra[fam, v]["drafting"].append(r["speculation_steps"] / max(r["steps"], 1))
                if r["speculation_steps"]:
                    extra[fam, v]["tau"].append(r["mean_accepted_tokens"])
            same[v, "all"] += 1
            same[v, "same"] += r["token_ids"] == pl["token_ids"]

print("# First probe at once, look-ahead stop, per-step draft cost (+ eager draft prefill in v1/ and v2/): "
      "old (08f4738) vs new\n")
print(f"Default ({M}) decode tokens/s ÷ plain decoding's, same prompt and pass, mean over prompts and both passes.\n")
print("| family | prompts × passes | old | new | new ÷ old | steps drafting old / new | mean K old / new | τ old / new |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
fams = sorted({f for f, _ in cells}, key=lambda f: (f == "all", f))
for fam in fams:
    o, n = cells[fam, "old"], cells[fam, "new"]
    if not o or not n:
        continue
    mo, mn = statistics.fmean(o), statistics.fmean(n)
    eo, en = extra[fam, "old"], extra[fam, "new"]
    f = lambda xs: statistics.fmean(xs) if xs else 0.0  # noqa: E731
    print(f"| {fam} | {len(n)} | {mo:.3f}× | {mn:.3f}× | {mn / mo:.3f} | {f(eo['drafting']):.2f} / {f(en['drafting']):.2f} "
          f"| {f(eo['k']):.2f} / {f(en['k']):.2f} | {f(eo['tau']):.2f} / {f(en['tau']):.2f} |")
print("\nidentical to plain decoding (greedy, ik_llama.cpp): " + ", ".join(
    f"{v} {same[v, 'same']}/{same[v, 'all']}" for v in ("old", "new")))

print("\n## `make demo`'s prompt (adaspec generate PROMPT --compare --threads 2), end-to-end tokens/s\n")
print("| run | version | default | plain ik_llama.cpp | plain llama.cpp | ÷ plain ik | ÷ plain llama.cpp | drafted steps | K per step (first 24) |")
print("|---|---|---:|---:|---:|---:|---:|---:|---|")
for f in sorted(here.glob("demo-*.json"), key=lambda f: (f.stem.split("-")[2], f.stem)):
    _, v, run = f.stem.split("-")
    d = json.loads(f.read_text())
    c, s = d["compare"], d["stats"]
    lc = c.get("other_runtimes_plain_tokens_per_s", {}).get("llama.cpp")
    ks = s.get("k_trace") or [r["k"] for r in s.get("step_records", [])]
    print(f"| {run} | {v} | {c['speculative_tokens_per_s']:.2f} | {c['plain_tokens_per_s']:.2f} | "
          f"{lc if lc is not None else '–'} | {c['speedup']:.2f}× | "
          f"{c['speculative_tokens_per_s'] / lc if lc else float('nan'):.2f}× | {s.get('speculation_steps', '–')} | "
          f"{' '.join(map(str, ks[:24]))} |")
