"""The draft model's per-proposal bookkeeping (ModelDrafter._sync) at a 4000-token sequence in a steady step (one
token to feed), and cached_prefix, on a model-free backend: microseconds per call, without and with a bounded
catch-up of 512.

    PYTHONPATH=src python docs/results/new-text/sync_cost.py     # from the repository root
"""

import random
import sys
import timeit
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from conftest import MarkovBackend  # noqa: E402

from adaspec.drafters import ModelDrafter  # noqa: E402

for bound in (None, 512):
    d = ModelDrafter(MarkovBackend(torch.zeros(4, 4, 4), "d"), catch_up=bound)
    ids = [random.Random(0).randrange(4) for _ in range(4000)]
    pending = d._sync(ids)  # the cache now holds all of ids (a model-free backend: recorded, not run)
    d.backend.ids.extend(pending)
    d._cached.extend(pending)
    d._stable = len(ids)
    ids.append(1)
    sync_us = timeit.timeit(lambda: d._sync(ids), number=20000) / 20000 * 1e6
    prefix_us = timeit.timeit(lambda: d.cached_prefix(ids), number=200) / 200 * 1e6
    print(f"catch_up={bound}: _sync {sync_us:.2f} us, cached_prefix {prefix_us:.0f} us")
