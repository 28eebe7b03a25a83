"""Cheaper draft variants of the zoo's 0.5B (requantised with ik_llama.cpp's llama-quantize): cost per drafted token
against greedy agreement with the target, and the speedup the i.i.d. model of Leviathan et al. (2023) predicts.

For each variant: one-token forward time on ik_llama.cpp (2 threads, median of 40, measured as the goodput
controller calibrates verification, at the context of the first new-code prompt and its answer, at most 300
tokens); teacher-forced greedy agreement with the target on the target's own greedy answers (the draft's argmax
at each answer position, given the target's tokens before it: for greedy decoding, the probability that a drafted
token is accepted given the ones before it were). The target's verification curve t_v(n) is measured in the same
process. Predicted speedup of a draft-model step at the best fixed K: E(K) / (K t_d + t_v(K + 1)) × t_v(1), with
E(K) = (1 − α^(K+1)) / (1 − α).

    PYTHONPATH=src python docs/results/new-text/draft_variants.py OUTDIR [--prompts N] [--types Q3_K_S,IQ4_KSS,...]
        [--vocab 16384,32768]

Appends to OUTDIR/variants.jsonl (one row per variant and family; use a fresh OUTDIR per run) and prints a markdown
table. Builds the variants in OUTDIR/gguf (deleted afterwards unless --keep). Run on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

FAMILIES = {"new code": "specbench:coding", "chat": "specbench:writing", "GSM8K": "gsm8k"}


def curve(backend, ids: list[int], widths, repeats: int) -> dict[int, float]:
    """{n: median ms} of forwards of n tokens after ``ids`` (:func:`~adaspec.backends.costcurve.measure_verify_curve`,
    the goodput controller's own calibration)."""
    from adaspec.backends.costcurve import measure_verify_curve

    backend.truncate(0)
    backend.forward(ids)
    return measure_verify_curve(backend, widths, repeats=repeats)


def agreement(backend, prompt: list[int], answer: list[int]) -> tuple[int, int]:
    """(draft argmax == target token, positions) over the answer, teacher-forced."""
    backend.truncate(0)
    logits = backend.forward(prompt + answer[:-1], num_logits=len(answer))
    pred = logits.argmax(-1).tolist()
    return sum(int(p == a) for p, a in zip(pred, answer)), len(answer)


def best_speedup(alpha: float, t_d: float, t_v: dict[int, float]) -> tuple[float, int]:
    best = (1.0, 0)
    for k in range(1, max(t_v)):
        e = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
        s = e / (k * t_d + t_v[k + 1]) * t_v[1]
        best = max(best, (s, k))
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--prompts", type=int, default=3, help="prompts per family (after the first 2, which the "
                    "peers and new-text runs use)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--types", default="IQ4_KSS,IQ3_K,IQ3_KS,Q3_K_S,IQ2_K,Q2_K")
    ap.add_argument("--output-type", default="q4_0", help="llama-quantize --output-tensor-type for every variant")
    ap.add_argument("--vocab", default="", help="also the Q4_0 variant with its vocabulary cut to the first N token "
                    "ids plus the special tokens (adaspec.models.prune_vocab; FR-Spec), for each N, e.g. 16384,32768")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    from adaspec.api import SpeculativeLM, load_model, set_threads
    from adaspec.backends.ik_backend import IkLlamaBackend
    from adaspec.request import default_eos_ids
    from adaspec.models import fetch_gguf, fetch_variant
    from adaspec.models.requantize import quantize_tool
    from adaspec.workloads import load_workload

    set_threads(2)
    out = Path(args.out)
    (out / "gguf").mkdir(parents=True, exist_ok=True)
    base = fetch_gguf("qwen2.5-coder-0.5b-instruct")
    files = {"Q4_K_M (zoo)": base, "Q4_0 (zoo variant, default)": fetch_variant("qwen2.5-coder-0.5b-instruct-q4_0")}
    for typ in [t for t in args.types.split(",") if t]:
        path = out / "gguf" / f"draft-{typ.lower()}.gguf"
        if not path.is_file():
            run = subprocess.run([str(quantize_tool()), "--allow-requantize", "--output-tensor-type", args.output_type,
                                  str(base), str(path), typ, "2"], capture_output=True, text=True)
            if run.returncode != 0:
                print(f"{typ}: llama-quantize failed: {(run.stdout + run.stderr).strip().splitlines()[-1:]}")
                continue
        files[f"{typ} (output {args.output_type})"] = path

    target = load_model("qwen2.5-coder-1.5b-instruct", backend="ik")
    for keep in [int(v) for v in args.vocab.split(",") if v]:
        from adaspec.models.prune_vocab import chat_template_ids, prune_vocab

        path = out / "gguf" / f"draft-q4_0-v{keep}.gguf"
        if not path.is_file():
            prune_vocab(files["Q4_0 (zoo variant, default)"], path, keep, extra=chat_template_ids(target.tokenizer))
        files[f"Q4_0, vocabulary cut to {keep} + specials + chat template"] = path
    lm = SpeculativeLM(target, None, None)
    prompts = {}
    for fam, wl in FAMILIES.items():
        rows = load_workload(wl, limit=2 + args.prompts)[2:2 + args.prompts]
        prompts[fam] = [lm.encode(list(p.messages) if p.messages else p.text, chat=True) for p in rows]
    answers = {}
    tb = target.backend
    eos = set(default_eos_ids(target.tokenizer))
    for fam, ids_list in prompts.items():
        answers[fam] = []
        for ids in ids_list:  # the target's greedy answer, one token at a time (plain decoding)
            tb.truncate(0)
            logits = tb.forward(ids)
            ans = []
            for _ in range(args.tokens):
                tok = int(logits[-1].argmax())
                ans.append(tok)
                if tok in eos:
                    break
                logits = tb.forward([tok])
            answers[fam].append(ans)
    ctx = prompts["new code"][0] + answers["new code"][0]
    t_v = curve(tb, ctx[:300], range(1, 10), 8)
    print("target t_v(n) ms:", {n: round(v, 1) for n, v in t_v.items()})
    rows = []
    with open(out / "variants.jsonl", "a") as f:
        for label, path in files.items():
            b = IkLlamaBackend(path, threads=2)
            t_d = curve(b, ctx[:300], (1,), 40)[1]
            for fam in FAMILIES:
                hit = n = 0
                for ids, ans in zip(prompts[fam], answers[fam]):
                    h, m = agreement(b, ids, ans)
                    hit, n = hit + h, n + m
                alpha = hit / n
                s, k = best_speedup(alpha, t_d, t_v)
                row = {"variant": label, "file_bytes": os.path.getsize(path), "family": fam, "t_d_ms": t_d,
                       "t_v1_ms": t_v[1], "alpha": alpha, "positions": n, "pred_speedup": s, "pred_k": k}
                rows.append(row)
                f.write(json.dumps(row) + "\n")
            b.close()
    print("\n| variant | MB | t_d ms (÷ t_v(1)) | " + " | ".join(f"{fam}: α / pred. speedup (K)" for fam in FAMILIES)
          + " |\n|---|---:|---:|" + "---:|" * len(FAMILIES))
    for label in files:
        rs = [r for r in rows if r["variant"] == label]
        if not rs:
            continue
        r0 = rs[0]
        cells = " | ".join(f"{r['alpha']:.3f} / {r['pred_speedup']:.2f}× ({r['pred_k']})" for r in rs)
        print(f"| {label} | {r0['file_bytes'] / 1e6:.0f} | {r0['t_d_ms']:.1f} ({r0['t_d_ms'] / r0['t_v1_ms']:.2f}) "
              f"| {cells} |")
    if not args.keep:
        for p in (out / "gguf").glob("*.gguf"):
            p.unlink()
        (out / "gguf").rmdir()


if __name__ == "__main__":
    main()
