"""Issue 15: the goodput controller with a verification curve seeded while the machine ran slow or fast, under the
old pricing (seeded values as they stand next to observed widths) and the new one (the seed gives the shape, the
live steps the level; CostModel.verify_ms). Simulated machine: the ik_llama.cpp 1.5B Q4_K_M curve on 2 AVX2 cores
(52 + 9 n ms), a 0.3 ms lookup drafter, acceptance α at every position; 5 seeds, K over steps 100-199.
Prints per rule and seed level: mean K per seed and the share of the best goodput reached.

Also times decide() under both rules. Usage: .venv/bin/python docs/results/issue15/seed_drift.py > docs/results/issue15/seed_drift.txt
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from test_controllers_goodput import Machine, drive  # noqa: E402

from adaspec.controllers import GoodputController  # noqa: E402
from adaspec.controllers.goodput import CostModel, _nearest  # noqa: E402


def old_verify_ms(self, n, b):
    """CostModel.verify_ms before 2026-12-02: a seeded width's value as it stands, beside observed widths."""
    own = _nearest(self.verify.keys() | self.seeded.keys(), b)
    observed, seeded = self.verify.get(own, {}), self.seeded.get(own, {})

    def known(m):
        return observed[m].value if m in observed else seeded[m]

    if n in observed or n in seeded:
        return known(n)
    ref = min(observed.keys() | seeded.keys(), key=lambda m: (abs(m - n), m))
    return known(ref) * self._shape(n, b) / self._shape(ref, b)


NEW = CostModel.verify_ms  # the rule now in the package
TRUE = {n: 52.0 + 9.0 * n for n in range(1, 10)}
for alpha in (0.9, 0.8):
    for rule, fn in (("old", old_verify_ms), ("new", NEW)):
        CostModel.verify_ms = fn
        for slow in (1.0, 1.25, 1.5, 0.8):
            effs, ks = [], []
            for seed in range(5):
                m = Machine(0.3, lambda n: TRUE[n], [alpha] * 8, seed=seed)
                c = GoodputController()
                c.costs.seed_verify({n: slow * v for n, v in TRUE.items()}, 100)
                k = drive(c, m, 200)[100:]
                effs.append(statistics.mean(m.goodput(x) for x in k) / m.goodput(m.best_k()))
                ks.append(statistics.mean(k))
            print(f"alpha {alpha} rule {rule} seed level {slow}: best K {m.best_k()}, mean K",
                  [round(x, 1) for x in ks], "share of the best goodput", [round(e, 3) for e in effs])

# The cost of a decision on the hot path (once per step): decide() after 200 steps, 8 widths observed.
import time  # noqa: E402

for rule, fn in (("old", old_verify_ms), ("new", NEW)):
    CostModel.verify_ms = fn
    m = Machine(0.3, lambda n: TRUE[n], [0.8] * 8, seed=1)
    c = GoodputController()
    c.costs.seed_verify(TRUE, 100)
    drive(c, m, 200)
    start = time.perf_counter()
    for _ in range(2000):
        c.decide(None)
    print(f"rule {rule}: decide() {(time.perf_counter() - start) / 2000 * 1e6:.0f} us "
          f"({len(c.costs.verify[0])} widths observed)")
