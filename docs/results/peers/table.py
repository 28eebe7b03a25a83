"""The findings page of docs/results/peers/run.sh: per workload family, decode tokens/s of every method, the
default's ratio to plain llama.cpp (llama-server:plain) and to the best peer, with the commit, the machine and the
weights of every engine; then compare's own report (α, identity, first differences, peers that did not answer).
Usage: table.py OUTDIR (reads peers.jsonl, report.md, commit.txt, cpu.txt there)."""

import json
import sys
from pathlib import Path

DEFAULTS = ("hybrid-suffix/goodput", "hybrid/goodput")  # the default method: today's, or the one runs before 2026-12-07 used
FAMILY = {"coding": "new code (Spec-Bench coding)", "writing": "chat (Spec-Bench writing)", "humaneval": "HumanEval",
          "gsm8k": "GSM8K"}


def family(row: dict) -> str:
    return FAMILY.get(row["category"], "code edits" if row["workload"] == "code-edit" else row["category"])


def main(out: Path) -> None:
    rows = [json.loads(line) for line in (out / "peers.jsonl").open() if line.strip()]
    ok = [r for r in rows if not r.get("error") and r.get("decode_ms")]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    # only prompts every answering method finished, as compare's summary does
    done: dict[str, set] = {}
    for r in ok:
        done.setdefault(r["prompt_id"], set()).add(r["method"])
    answering = {r["method"] for r in ok}
    complete = {p for p, ms in done.items() if ms >= answering}
    cells: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    alpha: dict[str, dict[str, list]] = {}
    for fam in dict.fromkeys(family(r) for r in ok):
        fr = [r for r in ok if family(r) == fam and r["prompt_id"] in complete]
        counts[fam] = len({r["prompt_id"] for r in fr})
        for m in answering:
            mr = [r for r in fr if r["method"] == m]
            ms = sum(r["decode_ms"] for r in mr)
            if mr and ms > 0:
                cells.setdefault(fam, {})[m] = sum(r["decode_tokens"] for r in mr) / (ms / 1e3)
                d = sum(r["draft_tokens"] or 0 for r in mr)
                if all(r.get("draft_tokens") is not None for r in mr) and d:
                    alpha.setdefault(fam, {})[m] = sum(r["accepted_tokens"] for r in mr) / d
    commit = (out / "commit.txt").read_text().strip()[:10] if (out / "commit.txt").exists() else "?"
    cpu = " ".join((out / "cpu.txt").read_text().split()) if (out / "cpu.txt").exists() else "?"
    weights = {r["method"]: r.get("weights") for r in ok if r.get("weights")}
    print(f"# adaspec beside its peers ({out.name})\n")
    print(f"Commit `{commit}`, machine: {cpu}. Command: `bash docs/results/peers/run.sh {out}`. Decode tokens/s "
          "(after the first token; each engine's own timings where it reports them, see the report below), "
          "greedy, 128 tokens, 2 threads, each peer in its own process, interleaved per prompt.\n")
    default = next((m for m in DEFAULTS if m in answering), DEFAULTS[0])
    shown = [m for m in methods if m in answering]
    peers = [m for m in shown if any(r.get("peer") for r in ok if r["method"] == m)]
    print("| family | prompts | " + " | ".join(shown) + " | default ÷ plain llama.cpp | default ÷ best peer |")
    print("|---|---:|" + "---:|" * len(shown) + "---:|---:|")
    for fam, c in cells.items():
        def fmt(m):
            if m not in c:
                return "–"
            a = alpha.get(fam, {}).get(m)
            return f"{c[m]:.1f}" + (f" (α {a:.2f})" if a is not None else "")
        best = max((m for m in peers if m in c), key=lambda m: c[m], default=None)
        d = c.get(default)
        vs_plain = f"{d / c['llama-server:plain']:.2f}×" if d and c.get("llama-server:plain") else "–"
        vs_best = f"{d / c[best]:.2f}× ({best})" if d and best else "–"
        print(f"| {fam} | {counts[fam]} | " + " | ".join(fmt(m) for m in shown) + f" | {vs_plain} | {vs_best} |")
    print("\nWeights: " + "; ".join(f"`{m}` {w}" for m, w in weights.items()) + "; adaspec on the zoo's GGUF "
          "(ik_llama.cpp).\n")
    missing = [m for m in methods if m not in answering]
    if missing:
        print("Did not answer (see the report below): " + ", ".join(f"`{m}`" for m in missing) + ".\n")
    report = out / "report.md"
    if report.exists():
        print("## compare's report\n")
        print(report.read_text())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
