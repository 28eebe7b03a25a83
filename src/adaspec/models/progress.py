"""Progress reporting shared by the stages: tqdm bars, announced long steps, and silencing transformers'
own progress bars when progress is off."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Iterator


def _tqdm(**kwargs):
    from tqdm.auto import tqdm

    return tqdm(**kwargs)


@contextlib.contextmanager
def _announce(message: str, enabled: bool) -> Iterator[None]:
    """Print ``message`` before a long step and how long it took after (transformers draws its own bars)."""
    if not enabled:
        yield
        return
    start = time.monotonic()
    print(f"{message} ...", file=sys.stderr, flush=True)
    ok = False
    try:
        yield
        ok = True
    finally:
        status = "done" if ok else "failed"
        print(f"{message}: {status} in {time.monotonic() - start:.0f}s", file=sys.stderr, flush=True)


def _step(message: str, enabled: bool) -> None:
    if enabled:
        print(f"  {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _transformers_progress(enabled: bool) -> Iterator[None]:
    """Silence transformers' own progress bars (and its GGUF de-quantising bar) when not wanted."""
    if enabled:
        yield
        return
    import functools

    from tqdm.auto import tqdm
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    old_tqdm = getattr(gguf_utils, "tqdm", None)
    if old_tqdm is not None:
        gguf_utils.tqdm = functools.partial(tqdm, disable=True)
    try:
        yield
    finally:
        if old_tqdm is not None:
            gguf_utils.tqdm = old_tqdm
        if was_enabled:
            hf_logging.enable_progress_bar()
