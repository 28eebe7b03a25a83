"""Which GGUF kernel path is closer to the model it quantizes: one token per forward (plain decoding) or K + 1
tokens per forward (speculative verification)?

For GSM8K questions, the prompt plus the first ``--tokens`` tokens of plain decoding's answer (from the eval's
results) are run three ways: the GGUF target one token per forward, the GGUF target ``--width`` tokens per forward,
and the same GGUF's weights de-quantised to fp32 by transformers (exactly the quantised model's weights, with fp32
activations; not the zoo's bf16 folder, whose rounding would blur the comparison) on PyTorch in one forward, the
reference (its own one-token vs batched difference is ~1e-4 logits). Per path: the mean and largest absolute logit
error against the reference, the mean KL(reference || path) in nats, and agreement with the reference's argmax,
overall and where the reference's top-1/top-2 margin is below 0.5 logits (the near-ties where the two paths' choices
can differ). Writes one JSON summary.

    python docs/results/issue16/kernel_fidelity.py --results docs/results/issue16/gguf/gsm8k.jsonl \
        --out docs/results/issue16/kernel-fidelity.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from adaspec.api import SpeculativeLM, load_model, set_threads
from adaspec.compare import read_results
from adaspec.controllers import FixedController
from adaspec.workloads import load_workload


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--runtime", default="ik")
    ap.add_argument("--results", required=True)
    ap.add_argument("--questions", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--width", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    set_threads(args.threads)
    gguf = load_model(f"{args.target}@{args.runtime}", progress=False, threads=args.threads)
    from transformers import AutoModelForCausalLM, GgufConfig

    from adaspec.backends.torch_backend import TorchBackend

    path = Path(gguf.backend.path)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                 quantization_config=GgufConfig(dequantize=True)).eval()
    ref = type("Ref", (), {"backend": TorchBackend(model, "fp32 reference")})()
    lm = SpeculativeLM(gguf, None, FixedController(0))
    prompts = {p.id: p for p in load_workload("gsm8k", args.questions)}
    answers = {r["prompt_id"]: r["token_ids"] for r in read_results(Path(args.results)) if r["method"] == "plain"}
    stats = {"one": [], "wide": []}
    for pid, prompt in prompts.items():
        ids = lm.encode(prompt.model_input(lm.has_chat_template))
        answer = answers[pid][:args.tokens]
        seq = ids + answer
        n = len(answer)  # logits predicting answer[1:] and beyond: positions len(ids) .. len(seq) - 1
        ref.backend.reset()
        r = ref.backend.forward(seq, n).float()
        paths = {}
        for name, width in (("one", 1), ("wide", args.width)):
            gguf.backend.reset()
            gguf.backend.forward(ids, 1)
            rows = []
            for start in range(0, n, width):
                chunk = answer[start:start + width]
                rows.append(gguf.backend.forward(chunk, len(chunk)).float())
            paths[name] = torch.cat(rows)
        top2 = r.topk(2, dim=-1).values
        near = (top2[:, 0] - top2[:, 1]) < 0.5
        logp_ref = torch.log_softmax(r, -1)
        for name, x in paths.items():
            err = (x - r).abs()
            kl = (logp_ref.exp() * (logp_ref - torch.log_softmax(x, -1))).sum(-1)
            agree = x.argmax(-1) == r.argmax(-1)
            stats[name].append({"prompt_id": pid, "positions": n, "mean_abs": float(err.mean()),
                                "max_abs": float(err.max()), "kl": float(kl.mean()), "agree": int(agree.sum()),
                                "near": int(near.sum()), "agree_near": int(agree[near].sum())})
        print(pid, {k: v[-1] for k, v in stats.items()}, flush=True)
    summary = {"target": args.target, "runtime": args.runtime, "width": args.width, "tokens": args.tokens,
               "questions": len(prompts), "per_prompt": stats}
    for name, rows in stats.items():
        pos = sum(s["positions"] for s in rows)
        summary[name] = {"mean_abs_logit_error": sum(s["mean_abs"] * s["positions"] for s in rows) / pos,
                         "max_abs_logit_error": max(s["max_abs"] for s in rows),
                         "mean_kl_nats": sum(s["kl"] * s["positions"] for s in rows) / pos,
                         "argmax_agreement": sum(s["agree"] for s in rows) / pos,
                         "near_ties": sum(s["near"] for s in rows),
                         "argmax_agreement_at_near_ties": sum(s["agree_near"] for s in rows)
                         / max(1, sum(s["near"] for s in rows))}
    Path(args.out).write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: summary[k] for k in ("one", "wide")}, indent=1))


if __name__ == "__main__":
    main()
