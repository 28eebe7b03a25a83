"""Prompts of an exact token length, padded with real text (never random tokens).

A sweep point at context L needs a prompt of L tokens that still ends in a real task, so that the target and the
drafters behave as they would on a long real prompt. The prompt is the task's chat message with "background
material" in front of the task: real documents from the package's evaluation data (``adaspec/data``, or ``$ADASPEC_DATA``) (Spec-Bench's summarization and RAG
articles first, then its other turns, GSM8K problems and HumanEval functions), cut at the token that makes the
whole prompt exactly L tokens long. Short contexts whose task alone is longer than L keep the task whole (the record
says how long the prompt really was).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache

from adaspec.workload_data import FILES, data_dir

MARKER = "\u0000PADDING\u0000"
INTRO = "Background material (you may ignore it):\n\n"


@lru_cache(maxsize=1)
def corpus_text(max_chars: int = 600_000) -> str:
    """Real text from the evaluation data folder, in a fixed order, at most ``max_chars`` characters."""
    folder = data_dir()
    first, rest = [], []
    with open(folder / FILES["specbench"], encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            (first if row.get("category") in ("summarization", "rag") else rest).extend(row["turns"])
    with open(folder / FILES["gsm8k"], encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            rest.append(f"{row['question']}\n{row['answer']}")
    with open(folder / FILES["humaneval"], encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            rest.append(row["prompt"] + row["canonical_solution"])
    text = "\n\n".join(first + rest)
    return text[:max_chars]


class ContextBuilder:
    """Builds token-exact prompts.

    Args:
        encode: text → token ids, without special tokens.
        template: wraps a user message into the model's prompt text (e.g. its chat template), or None for raw text.
        corpus: padding text (default: :func:`corpus_text`).
    """

    def __init__(self, encode: Callable[[str], list[int]], template: Callable[[str], str] | None = None,
                 corpus: str | None = None) -> None:
        self.encode = encode
        self.template = template
        self._corpus = corpus
        self._corpus_ids: list[int] | None = None

    def padding_ids(self, n: int) -> list[int]:
        """The first ``n`` tokens of the padding corpus. Raises ValueError if the corpus is shorter."""
        if self._corpus_ids is None or len(self._corpus_ids) < n:
            text = self._corpus if self._corpus is not None else corpus_text()
            self._corpus_ids = self.encode(text)
        if len(self._corpus_ids) < n:
            raise ValueError(f"the padding corpus has only {len(self._corpus_ids)} tokens, {n} needed")
        return self._corpus_ids[:n]

    def _parts(self, task: str) -> tuple[list[int], list[int]]:
        """Token ids before and after the padding of ``task``'s prompt."""
        message = f"{INTRO}{MARKER}\n\n{task}"
        text = self.template(message) if self.template is not None else message
        before, _, after = text.partition(MARKER)
        return self.encode(before), self.encode(after)

    def prefix_ids(self, task: str, length: int) -> list[int]:
        """``length`` tokens of the part every prompt of ``task`` starts with (head + padding), whatever its
        context length: a KV cache of these serves every :meth:`build` prompt of ``task`` up to its tail."""
        head, _ = self._parts(task)
        return head + self.padding_ids(max(0, length - len(head)))

    def build(self, task: str, length: int) -> list[int]:
        """Token ids of a prompt asking ``task`` after real background text, ``length`` tokens long (or the bare
        task's length when that is longer)."""
        head, tail = self._parts(task)
        room = length - len(head) - len(tail)
        if room <= 0:
            bare = self.template(task) if self.template is not None else task
            return self.encode(bare)
        return head + self.padding_ids(room) + tail


def hf_builder(tokenizer, chat: bool = True) -> ContextBuilder:
    """A :class:`ContextBuilder` for a Hugging Face tokenizer (its chat template applied when ``chat`` and it has
    one)."""
    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    def chat_template(message: str) -> str:
        return tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                             tokenize=False)

    use_chat = chat and bool(getattr(tokenizer, "chat_template", None))
    return ContextBuilder(encode, chat_template if use_chat else None)
