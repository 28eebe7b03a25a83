"""The cost model of speculative decoding: what a step yields and costs, shared by the goodput controller and the
study (``adaspec bench``, ``adaspec map``, ``adaspec profile``).

Source: Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative Decoding"), Theorem 3.8 and §3.3,
generalised to measured costs (all in milliseconds, at a context position ``at``):

    t_v(n)   target forward over n tokens (n = K + 1 verifies K drafts; + argmax + cache rollback);
    t_d      one drafted token of a drafter (0 for an n-gram lookup);
    o        engine overhead per step outside drafting and verification.

    E(K)     = 1 + Σ_{j=1..K} Π_{i<j} α[i]       expected tokens a step drafting K emits (:func:`expected_tokens`);
             = (1 − α^(K+1)) / (1 − α)            for i.i.d. acceptance α (K + 1 when α = 1)
    T(K)     = K t_d + t_v(K + 1) + o            a speculative step (:meth:`CostModel.spec_step_ms`)
    T(plain) = t_v(1) + o                        a plain step (:meth:`CostModel.plain_step_ms`)

Behind F tokens a grammar forces (drafted free, verified ahead of the draft): T_F(K) = K t_d + F t_f + t_v(F + K
+ 1) + o, where a draft model first feeds them at t_f per token (:meth:`CostModel.feed_ms`), and T_F(plain) =
t_v(F + 1) + o, the forced tokens alone (the ``forced`` argument of both methods).
    speedup  = E(K) / T(K) × T(plain)            (:meth:`CostModel.speedup`)

Where the costs come from is a subclass's business: :class:`MeasuredCosts` (here) learns them per context bucket
from the engine's own steps (the goodput controller); :class:`adaspec.bench.costmodel.FittedCostModel` fits curves
in the context length to micro-measurements (the study); :class:`adaspec.bench.hardware.RooflineCostModel`
predicts them from a hardware profile.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

from adaspec.backends.costcurve import interpolate
from adaspec.stats import StepRecord


def expected_tokens(alpha: float | Sequence[float], k: float) -> float:
    """E[tokens emitted] by a step drafting ``k`` tokens: with conditional per-position acceptances ``alpha`` (a
    sequence; 1 + Σ_{j=1..k} Π_{i<j} α[i]), or with i.i.d. acceptance ``alpha`` (a number;
    (1 − α^(k+1)) / (1 − α), also for a fractional mean ``k``; 1 when ``k`` <= 0)."""
    if isinstance(alpha, Sequence):
        total, reach = 1.0, 1.0
        for a in alpha[:k]:
            reach *= a
            total += reach
        return total
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class CostModel:
    """The step costs of one setting and the speedups they predict (see the module docstring). A subclass gives
    the costs at ``at`` (a context length, or a context bucket for :class:`MeasuredCosts`): :meth:`verify_ms`,
    :meth:`draft_ms` and :meth:`step_overhead_ms`."""

    def verify_ms(self, n: float, at: float) -> float:
        """t_v(n) at ``at``, ms."""
        raise NotImplementedError

    def draft_ms(self, drafter, at: float) -> float | None:
        """t_d of ``drafter`` at ``at``, ms per token (None: not known)."""
        raise NotImplementedError

    def step_overhead_ms(self) -> float:
        """o, ms per step."""
        raise NotImplementedError

    def feed_ms(self, drafter, at: float) -> float:
        """t_f: feeding a drafter one token it has not seen, ms (default: nothing to feed)."""
        return 0.0

    def plain_step_ms(self, at: float, forced: int = 0) -> float:
        """T(plain) at ``at``, ms: a step that drafts nothing, verifying ``forced`` forced tokens ahead."""
        return self.verify_ms(forced + 1, at) + self.step_overhead_ms()

    def draft_step_ms(self, k: float, at: float, drafter) -> float:
        """Drafting time of a step that drafts ``k`` tokens, ms: K t_d (a subclass may measure it otherwise)."""
        return k * self.draft_ms(drafter, at)

    def marginal_draft_ms(self, drafter, at: float) -> float:
        """What one more drafted token adds to a step's drafting time, ms: t_d (a subclass may measure it)."""
        return self.draft_ms(drafter, at)

    def spec_step_ms(self, k: float, at: float, drafter, catch_up_ms: float = 0.0, forced: int = 0) -> float:
        """T(K) at ``at``, plus ``catch_up_ms`` (a drafter's share of feeding the tokens it missed), behind
        ``forced`` forced tokens (fed to the drafter first, verified ahead of the draft). ``drafter`` needs a known
        draft time."""
        drafting = self.draft_step_ms(k, at, drafter) + forced * self.feed_ms(drafter, at)
        return drafting + self.verify_ms(forced + k + 1, at) + self.step_overhead_ms() + catch_up_ms

    # Predictions (i.i.d. acceptance α) ---------------------------------------------------------------------
    def speedup(self, alpha: float, k: float, at: float, drafter, plain_fraction: float = 0.0) -> float:
        """Predicted decode speedup over plain decoding.

        ``plain_fraction`` is the share of steps that draft nothing (an n-gram miss, an adaptive fallback):
        they emit one token at plain-step cost.
        """
        t_plain = self.plain_step_ms(at)
        if k <= 0:
            return 1.0
        p = min(max(plain_fraction, 0.0), 1.0)
        tokens = (1 - p) * expected_tokens(alpha, k) + p
        time = (1 - p) * self.spec_step_ms(k, at, drafter) + p * t_plain
        return tokens / time * t_plain

    def min_alpha(self, k: int, at: float, drafter) -> float:
        """The smallest α with speedup ≥ 1 (bisection; speedup grows with α). 0.0 if it always pays, nan if
        never."""
        if self.speedup(0.0, k, at, drafter) >= 1.0:
            return 0.0
        if self.speedup(1.0, k, at, drafter) < 1.0:
            return math.nan
        lo, hi = 0.0, 1.0
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.speedup(mid, k, at, drafter) < 1.0 else (lo, mid)
        return hi

    def best_k(self, alpha: float, at: float, drafter, ks: Iterable[int] = range(1, 17)) -> tuple[int, float]:
        """``(K, speedup)`` maximising predicted speedup over ``ks`` (K = 0, plain decoding, if nothing beats 1)."""
        best = (0, 1.0)
        for k in ks:
            s = self.speedup(alpha, k, at, drafter)
            if s > best[1]:
                best = (k, s)
        return best

    def break_even_context(self, alpha: float, k: int, drafter, max_context: float = 131072) -> float:
        """The context length beyond which speedup(α, K, L) < 1 (bisection over L); 0 if it never pays, inf if
        it pays up to ``max_context``."""
        if self.speedup(alpha, k, 0, drafter) < 1.0:
            return 0.0
        if self.speedup(alpha, k, max_context, drafter) >= 1.0:
            return math.inf
        lo, hi = 0.0, float(max_context)
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.speedup(alpha, k, mid, drafter) >= 1.0 else (lo, mid)
        return lo


BUCKET_EDGES = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
"""Context-length bucket boundaries (tokens): bucket b holds contexts in [edge[b-1], edge[b])."""


def bucket_of(context_len: int) -> int:
    return bisect.bisect_right(BUCKET_EDGES, context_len)


class Recent:
    """Median of the last ``size`` samples: a running estimate robust to one-off outliers (a lazy prefill inside a
    draft, a page fault), yet quick to follow a real change."""

    def __init__(self, size: int = 9) -> None:
        self.samples: deque[float] = deque(maxlen=size)

    def add(self, x: float) -> None:
        self.samples.append(float(x))

    @property
    def value(self) -> float:
        return statistics.median(self.samples)

    def __bool__(self) -> bool:
        return bool(self.samples)


class MeasuredCosts(CostModel):
    """Step costs in milliseconds measured while decoding: per-token draft time and per-token catch-up time per
    drafter, and verification time per number of verified tokens, by context bucket ``b`` (:func:`bucket_of`; the
    ``at`` of :class:`CostModel`), plus the per-step overhead. See :mod:`adaspec.controllers.goodput`."""

    STEADY = 2  # a drafter that drafted the step before has at most 2 tokens to feed (last draft + correction)
    NEGLIGIBLE = 0.05  # a step with catch-up whose whole draft time is below this share of its verification is
    # steady enough to measure draft time from (n-gram lookups: no model to feed)

    def __init__(self, window: int = 9) -> None:
        self.window = window
        self.draft: dict[str, dict[int, Recent]] = {}
        self.unsteady: dict[str, deque[tuple[float, int, int]]] = {}  # (draft_ms, drafted, extra) of steps with
        # catch-up seen before any steady step of that drafter: split into draft and feed time once one is seen
        self.feed: dict[str, Recent] = {}  # per-token time of feeding missed tokens (catch-up, lazy prefill)
        self.verify: dict[int, dict[int, Recent]] = {}
        self.shape: dict[int, Recent] = {}  # verification time per n, all buckets pooled
        self.seeded: dict[int, dict[int, float]] = {}  # per bucket: a measured verification curve {n: ms}
        self.seed_raw: dict[int, dict[int, float]] = {}  # per bucket: the seeded samples before smoothing
        self.seed_as_measured = False  # seeds are not levelled by observed steps, in any bucket (a batched row)
        self.draft_seed: dict[str, tuple[float, float]] = {}  # per drafter: measured (draft, feed) ms per token,
        # used until its own steps measure them (seed_draft)
        # per (drafter, bucket): (drafted, draft ms) of steady chain steps, and the line fitted to them
        self.draft_pairs: dict[tuple[str, int], deque[tuple[int, float]]] = {}
        self.draft_fit: dict[tuple[str, int], tuple[float, float]] = {}  # (ms per step, ms per token)
        self.overhead = Recent(window)

    def observe(self, step: StepRecord, behind: int = 0) -> None:
        """Record a step. ``behind``: tokens of the sequence its drafter had not seen before drafting (at most
        :attr:`STEADY` when it also drafted the step before; the prompt tokens a lazily prefilled draft model
        lacks at its first draft). The time of feeding those beyond STEADY is catch-up, a cost of switching
        drafters, measured apart from the draft time per token."""
        b = bucket_of(step.context_len)
        n = step.forced + step.drafted + 1  # the forward's width (the grammar's forced tokens ahead of the draft)
        self.verify.setdefault(b, {}).setdefault(n, Recent(self.window)).add(step.verify_ms)
        self.shape.setdefault(n, Recent(4 * self.window)).add(step.verify_ms)
        if step.drafted:
            d, extra = step.drafter, behind - self.STEADY
            if extra <= 0:
                self.draft.setdefault(d, {}).setdefault(b, Recent(self.window)).add(step.draft_ms / step.drafted)
                if not step.tree:  # a tree's drafted counts its nodes, not the draft's forwards
                    self._observe_pair(d, b, step.drafted, step.draft_ms)
                for draft_ms, drafted, extra_then in self.unsteady.pop(d, []):
                    self._observe_feed(d, b, draft_ms, drafted, extra_then)
            elif d in self.draft:
                self._observe_feed(d, b, step.draft_ms, step.drafted, extra)
            elif step.draft_ms <= self.NEGLIGIBLE * step.verify_ms:  # no catch-up worth the name (a lookup)
                self.draft.setdefault(d, {}).setdefault(b, Recent(self.window)).add(step.draft_ms / step.drafted)
            else:
                self.unsteady.setdefault(d, deque(maxlen=self.window)).append((step.draft_ms, step.drafted, extra))
        self.overhead.add(max(0.0, step.total_ms - step.draft_ms - step.verify_ms))

    def _observe_feed(self, d: str, b: int, draft_ms: float, drafted: int, extra: int) -> None:
        drafting = self.draft_step_ms(drafted, b, d) if self.draft_ms(d, b) else 0.0
        self.feed.setdefault(d, Recent(self.window)).add(max(draft_ms - drafting, 0.0) / extra)

    def _observe_pair(self, d: str, b: int, drafted: int, draft_ms: float) -> None:
        """Refit ``d``'s steady draft time at bucket ``b`` as ms per step + ms per token (:meth:`draft_step_ms`) with a new step:
        a least-squares line through the median time of each draft length among the last ``4 · window`` steady
        steps, weighted by how many steps each has, once at least two lengths have two steps each (no fit before:
        the per-token median stands). A fit whose line leaves the measured range (negative per-step or per-token
        time) is not kept."""
        pairs = self.draft_pairs.setdefault((d, b), deque(maxlen=4 * self.window))
        pairs.append((drafted, draft_ms))
        groups: dict[int, list[float]] = {}
        for n, ms in pairs:
            groups.setdefault(n, []).append(ms)
        points = [(n, statistics.median(v), len(v)) for n, v in groups.items() if len(v) >= 2]
        self.draft_fit.pop((d, b), None)
        if len(points) < 2:
            return
        weight = sum(w for _, _, w in points)
        mean_n = sum(n * w for n, _, w in points) / weight
        mean_ms = sum(ms * w for _, ms, w in points) / weight
        spread = sum(w * (n - mean_n) ** 2 for n, _, w in points)
        per_token = sum(w * (n - mean_n) * (ms - mean_ms) for n, ms, w in points) / spread
        per_step = mean_ms - per_token * mean_n
        if per_token > 0 and per_step >= 0:
            self.draft_fit[d, b] = (per_step, per_token)

    def seed_verify(self, curve: Mapping[int, float], context_len: int, *, level_from_steps: bool = True) -> None:
        """Seed the verification curve with ``curve`` ({n tokens: ms per forward}) measured at ``context_len``
        tokens of context. It is made non-decreasing in n first (pool-adjacent-violators: verifying more tokens
        never costs less; a noisy sample such as t(5) = 134, t(6) = 124 ms becomes 129, 129). Until a step is
        observed in that bucket the seeded values are used as measured; in every bucket the seeded curve gives the
        shape for the widths not observed (see :meth:`verify_ms`).

        ``level_from_steps=False`` keeps the seeded values as measured beside observed widths, in every bucket
        from then on (the rule before 2026-12-02): for a batched row, whose observed steps time the whole batch's
        forward while the seed is indexed by the tokens in that forward, so the two are not on one curve.

        Raises:
            ValueError: an empty curve, or a time that is not a positive finite number."""
        if not curve or not all(math.isfinite(ms) and ms > 0 for ms in curve.values()):
            raise ValueError(f"need a non-empty curve of positive, finite times, got {dict(curve)}")
        b = bucket_of(context_len)
        self.seed_raw.setdefault(b, {}).update({int(n): float(ms) for n, ms in curve.items()})
        self.seeded[b] = _non_decreasing(self.seed_raw[b])  # of the raw samples, so re-seeding does not drift
        if not level_from_steps:
            self.seed_as_measured = True

    def seed_draft(self, drafter: str, draft_ms: float, feed_ms: float) -> None:
        """Seed ``drafter``'s per-token draft and catch-up (feed) times in ms, measured outside decoding (e.g. by
        :func:`~adaspec.backends.costcurve.measure_draft_costs`), so that its first proposal, and the prompt a
        lazily prefilled draft model feeds then, is priced before it is paid. Its own steps replace them."""
        if draft_ms <= 0 or feed_ms < 0:
            raise ValueError(f"need draft_ms > 0 and feed_ms >= 0, got {draft_ms}, {feed_ms}")
        self.draft_seed[drafter] = (float(draft_ms), float(feed_ms))

    @property
    def measured(self) -> bool:
        return bool(self.verify or self.seeded)

    def overhead_ms(self) -> float:
        return self.overhead.value if self.overhead else 0.0

    def step_overhead_ms(self) -> float:
        return self.overhead_ms()

    def draft_ms(self, drafter: str, b: int) -> float | None:
        """Per-token draft time of ``drafter`` at bucket ``b`` (nearest measured bucket); until a step without
        catch-up was measured (a step with catch-up mixes feeding the missed tokens into the draft time), its seed
        (:meth:`seed_draft`), else None."""
        per_bucket = self.draft.get(drafter)
        if per_bucket:
            return per_bucket[_nearest(per_bucket, b)].value
        seed = self.draft_seed.get(drafter)
        return seed[0] if seed else None

    def draft_step_ms(self, k: float, at: int, drafter: str) -> float:
        """Drafting time of a step that drafts ``k`` tokens at bucket ``at``: ``s + k t`` where the drafter's steady
        chain steps in that bucket have been fitted as ms per step ``s`` plus ms per token ``t``
        (:meth:`_observe_pair`), else
        ``k · draft_ms``. A draft model's step first feeds the previous step's last draft and correction, one
        forward whatever K, so its per-token median over steps of K = 1 bills that forward to the one token and
        makes deeper drafts look dearer than they are."""
        fit = self.draft_fit.get((drafter, at))
        return fit[0] + k * fit[1] if fit else k * self.draft_ms(drafter, at)

    def marginal_draft_ms(self, drafter: str, at: int) -> float:
        """One more drafted token's time: the fitted ms per token (:meth:`draft_step_ms`), else ``draft_ms``."""
        fit = self.draft_fit.get((drafter, at))
        return fit[1] if fit else self.draft_ms(drafter, at)

    def feed_ms(self, drafter: str, b: int) -> float:
        """Per-token catch-up time of ``drafter`` (before it was measured: its seed, else a quarter of its draft
        time per token, as a draft model feeding several tokens in one forward is cheaper per token than drafting
        them)."""
        if drafter in self.feed:
            return self.feed[drafter].value
        if drafter in self.draft_seed:
            return self.draft_seed[drafter][1]
        return 0.25 * (self.draft_ms(drafter, b) or 0.0)

    def verify_ms(self, n: int, b: int) -> float:
        """Verification time (ms) of ``n`` tokens at bucket ``b``. Needs a measurement or a seed (``measured``).

        The nearest bucket with any data gives its observed median for n; else, once it has observed any width,
        the bucket's level times the shape, ``level · shape(n)``, where the level is the median over the widths
        m observed there of ``t(m) / shape(m)``; else (seeded only) its seeded value for n, or its nearest seeded
        width scaled by the shape.

        A seeded value is not mixed with observed ones as it stands: the seed gives the curve's shape, the live
        steps its level. The machine's speed drifts (10-20 % within minutes on a shared VM), and a curve measured
        while it was slow, next to fast observations of the widths the controller runs, made every width it had
        not run look dear: it kept drafting short and never observed the longer drafts that would have shown it
        wrong (the likely cause of an `adaspec serve` run at mean K 2.9 instead of 5-6 and half the speed, whose
        warm-up ran 20 % slow: `docs/results/issue15`). One level per bucket, a median, so one width timed in
        another spell does not bend the curve around it (it can still bend where observed widths, which keep their
        own medians, were timed in different spells). A cost model seeded with ``level_from_steps=False`` (a
        batched row) keeps the old rule in every bucket: seeded values as measured, the rest scaled from the
        nearest known width."""
        own = _nearest(self.verify.keys() | self.seeded.keys(), b)
        observed, seeded = self.verify.get(own, {}), self.seeded.get(own, {})
        if n in observed:
            return observed[n].value
        ratios = [observed[m].value / shape for m in observed
                  if not self.seed_as_measured and (shape := self._shape(m, b)) > 0]
        if ratios:
            return statistics.median(ratios) * self._shape(n, b)
        if n in seeded:
            return seeded[n]
        known = {m: r.value for m, r in observed.items()} | {m: v for m, v in seeded.items() if m not in observed}
        ref = min(known, key=lambda m: (abs(m - n), m))
        return known[ref] * self._shape(n, b) / self._shape(ref, b)

    def _shape(self, n: int, b: int) -> float:
        """The curve's shape at ``n``: the seeded curve of the bucket nearest ``b`` when one was seeded, else the
        pooled observations; piecewise linear, extended with the slope of the last segment."""
        if self.seeded:
            return interpolate(self.seeded[_nearest(self.seeded, b)], n)
        return interpolate({m: r.value for m, r in self.shape.items()}, n)


def _nearest(table: Iterable[int], b: int) -> int:
    return min(table, key=lambda key: (abs(key - b), key))


def _non_decreasing(curve: Mapping[int, float]) -> dict[int, float]:
    """The least-squares non-decreasing fit of ``curve`` ({n: ms}) in n: pool-adjacent-violators (Barlow et al.
    1972), each violating run replaced by its mean."""
    blocks: list[list[float]] = []  # [sum, count] per pooled run, left to right
    xs = sorted(curve)
    for x in xs:
        blocks.append([float(curve[x]), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    values = [total / count for total, count in blocks for _ in range(int(count))]
    return dict(zip(xs, values))
