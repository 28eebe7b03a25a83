"""A draft model with its vocabulary cut (FR-Spec, Zhao et al. 2025: the LM head and embeddings kept for the first N
token ids plus the special tokens, :mod:`adaspec.models.prune_vocab`) against the default draft, inside the default
drafter and controller, alternated per prompt with plain decoding in one process: the last 3 Spec-Bench coding and
writing prompts, 3 GSM8K, 2 HumanEval and 2 code-edit prompts, 128 tokens, greedy, two passes (the arms' order
rotates per prompt and pass; each request has its own suffix-cache partition and every draft model forgets its
cache before each request). Arms: ``q4_0`` (the default draft), ``v65536`` and ``v32768`` (the same file cut to the
first 65,536 / 32,768 ids plus the specials and the chat template's tokens, built into OUTDIR if missing; the first run,
2026-12-07-vocab-cut-ab, did not keep the template's tokens, so "assistant" reached its cut drafts as "assis").

    PYTHONPATH=src python docs/results/new-text/vocab_cut_ab.py OUTDIR      # from the repository root, quiet
    python docs/results/new-text/vocab_cut_ab.py --summary OUTDIR/rows.jsonl
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from min_gain_ab import run, summary  # noqa: E402  (the same A/B with other arms)

KEEP = (65536, 32768)
WORKLOADS = (("specbench:coding", -3), ("specbench:writing", -3), ("gsm8k", 3), ("humaneval", 2), ("code-edit", 2))


def main(out: Path) -> None:
    from transformers import AutoTokenizer

    from adaspec.models import fetch_variant
    from adaspec.models.resolve import resolve_gguf
    from adaspec.models.prune_vocab import chat_template_ids, prune_vocab
    from adaspec.models.registry import DEFAULT_DRAFT

    out.mkdir(parents=True, exist_ok=True)
    arms: dict[str, dict] = {"q4_0": {}}
    extra = chat_template_ids(AutoTokenizer.from_pretrained(str(resolve_gguf(DEFAULT_DRAFT)[2])))
    for keep in KEEP:
        path = out / "gguf" / f"draft-q4_0-v{keep}.gguf"
        if not path.is_file():
            path.parent.mkdir(exist_ok=True)
            prune_vocab(fetch_variant(DEFAULT_DRAFT), path, keep, extra=extra)
        arms[f"v{keep}"] = {"draft": str(path)}
    run(str(out / "rows.jsonl"), arms, WORKLOADS, forget=True, demo=False)


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        summary(sys.argv[2])
    else:
        main(Path(sys.argv[1]))
