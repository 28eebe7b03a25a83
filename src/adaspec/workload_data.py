"""The shipped evaluation data and the prompt type every workload yields: where the data lies (:func:`data_dir`),
its files (:data:`FILES`), how a file is read (:func:`read_rows`) and :class:`Prompt`.

Read by :mod:`adaspec.workloads` (the named workloads) and :mod:`adaspec.agentic` (the agentic sessions).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from adaspec.errors import AdaspecError

FILES = {"humaneval": "humaneval_dev.jsonl", "gsm8k": "gsm8k_dev.jsonl", "specbench": "spec_bench_questions.jsonl"}


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt: a stable id, its category (the workload name when it has none), the user text (the
    last user turn of a conversation) and, for a conversation, its OpenAI-style ``messages``
    (``{"role": ..., "content": ...}``, ending with the user's turn). ``step``: its place in a session of requests
    run in order (the ``agentic`` workload), else None."""

    id: str
    category: str
    text: str
    messages: tuple[dict, ...] | None = field(default=None, hash=False)
    step: int | None = None

    def as_text(self) -> str:
        """The whole prompt as one string: the text, or a conversation as a "Role: content" transcript."""
        if not self.messages:
            return self.text
        return "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in self.messages)

    def model_input(self, chat: bool = True) -> str | list[dict]:
        """What to encode: the messages of a conversation when ``chat`` (the model has a chat template), else
        :meth:`as_text` (``SpeculativeLM.encode`` takes either)."""
        return list(self.messages) if self.messages and chat else self.as_text()


def data_dir() -> Path:
    """The evaluation data folder: ``$ADASPEC_DATA`` when set, else the package's ``adaspec/data``.

    Raises:
        AdaspecError: ``$ADASPEC_DATA`` is not a folder, or the package is installed zipped (no folder on disk).
    """
    env = os.environ.get("ADASPEC_DATA")
    if env:
        if not Path(env).is_dir():
            raise AdaspecError(f"ADASPEC_DATA={env!r} is not a folder")
        return Path(env)
    packaged = resources.files("adaspec") / "data"
    if not isinstance(packaged, Path):
        raise AdaspecError("adaspec's data is not on disk (zipped install): set ADASPEC_DATA to a folder of the data")
    return packaged


def read_rows(path: Path) -> Iterator[dict]:
    """The JSON objects of a JSONL file, one per non-blank line.

    Raises:
        AdaspecError: no such file.
    """
    if not path.is_file():
        raise AdaspecError(f"no data file {path} (check ADASPEC_DATA)")
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)
