"""Goodput (cost-model) controller: before each step, the drafter and K that maximise expected tokens per second.

Source: Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative Decoding"), Theorem 3.8 and §3.3:
with i.i.d. acceptance α, K drafts emit E = (1 − α^(K+1)) / (1 − α) tokens per target forward, and the best K
maximises E over the step's cost. Here the acceptance is position-dependent and every cost is measured on this
machine, per context-length bucket, while decoding:

    α_d[i]     P(draft position i of drafter d is accepted | positions < i were): forgetful counts of accepted /
               reached positions (each speculative step multiplies the old counts by ``forget``, each plain step
               by ``plain_forget``); a position with few observations is shrunk toward the position before it
               (``shrink`` pseudo-observations; position 0 toward ``prior``).
    t_d(d, L)  drafting time per token of drafter d at context bucket L: median of recent draft_ms / drafted over
               steps without catch-up (d drafted the step before, so it only feeds the last draft and correction).
               Once such steps of two draft lengths have been seen, K drafted tokens cost s_d + K t'_d instead of
               K t_d, a line fitted to them (:meth:`MeasuredCosts.draft_step_ms`): a draft model's step starts with
               one forward over the last draft and correction whatever K, a cost per step, not per token.
    f_d        catch-up time per token: a drafter that sat out some steps (or, prefilled lazily, never ran in this
               request) first feeds the c tokens it missed; measured from such steps as
               (draft_ms − drafting time of its K) / (c − 2). At a request's start the engine tells the controller
               how
               much of the sequence each drafter already holds (:meth:`GoodputController.set_synced`: a draft
               model keeps its cache across requests that share a prefix), so c counts only the tokens it lacks.
    t_v(n, L)  target verification time of n = K + 1 tokens at context bucket L: median of recent verify_ms per
               measured n; for an n not yet run in that bucket, a value seeded from a measured curve
               (:meth:`MeasuredCosts.seed_verify`, which :meth:`GoodputController.calibrate` fills in the engine's
               warm-up with :func:`~adaspec.backends.costcurve.measure_verify_curve`, made non-decreasing):
               real observations win, and once a bucket has any, their median ratio to the seed sets its level
               there (the seed gives only the shape: a curve measured while the machine ran slow must not make the
               widths not yet run look dear; batched rows excepted, see :meth:`MeasuredCosts.seed_verify`). A
               bucket lacking some n takes it from its nearest known n scaled by the curve's shape: the seeded
               curve (of the nearest seeded bucket) when there is one, else all buckets' observations pooled. The
               shape is piecewise linear between its points and extended with the slope of its last segment beyond
               the largest (flat with one point). So verification cost is measured, not assumed flat or linear: it
               is nearly flat on memory-bound hardware and grows on compute-bound hardware, where a seeded curve
               lets K reach the widths the controller has not run yet.
    o          engine overhead per step outside drafting and verification (median of recent steps).

    E_d(K)  = 1 + Σ_{j=1..K} Π_{i<j} α_d[i]                            expected tokens emitted by the step
    G(d, K) = E_d(K) / (K t_d(d, L) + t_v(K + 1, L) + o + f_d c / H)    expected tokens per millisecond
              (K t_d read as s_d + K t'_d once fitted)
    G(plain) = 1 / (t_v(1, L) + o)

where the one-off catch-up f_d · c is spread over the ``horizon`` H steps that switching to d is expected to
last. (Where a long prompt costs seconds to feed to a draft model, speculating for a short answer does not pay.)

**Behind a grammar's forced tokens** (``price_forced``; the engine calls :meth:`GoodputController.set_forced`
before the step): the step verifies the F tokens the grammar forces ahead of the draft, emitted with certainty
and drafted free, and the drafter continues after them, so

    G_F(d, K)  = (F + E_d(K)) / (K t_d + F f_d + t_v(F + K + 1, L) + o + f_d c / H)
    G_F(plain) = (F + 1) / (t_v(F + 1, L) + o)                    the forced tokens alone (F = 0: a plain step)

(a draft model first feeds the F tokens, at its catch-up price per token). The step it is then shown counts the F
tokens in :attr:`StepRecord.forced <adaspec.stats.StepRecord>`, not in ``drafted``, so its verification time is
booked at width F + drafted + 1 and the drafter's acceptance stays its own; with ``forced_apart`` the acceptance
of drafts behind forced tokens (and the depth probe's and first probe's view of it) is counted apart from the
drafter's other drafts (the token after a forced run is often all but forced, a bracket the grammar allows in more
than one token), starting from the drafter's own α at position 0. A step behind forced tokens is a catch-up step
for the drafter's draft time (it fed them first). ``price_forced=False``: K planned and steps booked as if
nothing were forced (the engine still routes the lookups after the forced tokens).

K ranges over 1..k_max (and no further than a lookup drafter's match can propose). The controller speculates with
the best (d, K) when G(d, K) >= min_gain · G(plain) and takes a plain step (K = 0) otherwise, so speculation never
runs where it is predicted to lose. When nothing pays it still probes the most promising drafter that has sat out
more than its probe gap (``probe_init`` steps, doubling up to ``probe_max`` while that drafter keeps losing; none
for a drafter never observed, whose acceptance is only the prior; counted
per drafter, so a lookup drafter that pays now and then does not starve the draft model of probes), to notice when
the text turns predictable, unless the probe's catch-up would cost more than a ``probe_share`` of the request's
time so far (at least one plain step, at most ``probe_budget``): a short request never pays a draft prefill it
cannot earn back. A drafter whose draft
time was never measured without catch-up is tried at ``k_init`` (twice in a row for a lazily prefilled draft model:
the first try feeds it the prompt tokens it lacks, the second measures t_d, and the first is then booked as
catch-up f_d), unless its t_d and f_d were seeded from a measurement made elsewhere
(:meth:`GoodputController.seed_draft_costs`: a batched row gets what the batch engine measured), in which case its
first proposal is priced like any other, catch-up included. The chosen drafter's depth is probed too: while the
position after its best K has fewer than ``shrink`` observations (its α there is the position before it, shrunk, not
measured) and a deeper draft would beat the plan if every draft were accepted, it drafts to min(best-case K, 2K + 1)
once per depth gap (``probe_init`` chosen steps, doubling up to ``probe_max`` while such probes lose). A lookup
drafter's acceptance is not i.i.d. (a repeated answer is accepted to its end once its first tokens are), so without
the probe its first positions' mixed record keeps K small and the deeper positions are never measured. The first
step of every request is plain (it costs nothing against plain decoding and tells the controller the context
length, which the catch-up cost needs). Costs
persist across requests (they belong to the machine); acceptance counts are scaled by ``carry`` at each new
request (they belong to the text).

**Stop within a step** (``confidence_stop``; SpecDec++'s threshold policy, Huang et al. 2024, with the threshold
derived from the cost model instead of tuned): a drafter that reports its token probabilities q (a draft model
does) may draft up to k_max tokens, and stops after token j once

    Π_{i<=j} â(q_i) · Σ_{i=j+1..m} Π_{l=j+1..i} α_d[l]  <  G(d, K) · ((m − j) t_d + t_v(m+2, L) − t_v(j+2, L))
    for every m > j,

i.e. when drafting on to any later token would add fewer expected tokens per millisecond than the step's planned
goodput, which is when it would lower the step's tokens per millisecond (for m = j + 1 alone this is the next
token's marginal rule, which stops too early where one more token costs much more verification than the few
after it). â(q) is the probability that a token drafted with
probability q is accepted, calibrated online on verified outcomes (:class:`~adaspec.controllers.threshold.Calibration`).

With a :class:`~adaspec.drafters.multi.MultiDrafter` the engine asks :meth:`GoodputController.choose_drafter`
each step, which weighs every sub-drafter that can propose now (e.g. a free n-gram match against the draft model).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from adaspec.backends.base import Backend
from adaspec.backends.costcurve import DEFAULT_WIDTHS, measure_verify_curve
from adaspec.controllers.acceptance import Acceptance
from adaspec.controllers.base import Controller
from adaspec.controllers.costmodel import (BUCKET_EDGES, MeasuredCosts, Recent, _nearest,  # noqa: F401 (re-exported)
                                           bucket_of, expected_tokens)
from adaspec.controllers.threshold import Calibration
from adaspec.drafters.base import DraftStop
from adaspec.errors import ConfigError
from adaspec.stats import StepRecord

CostModel = MeasuredCosts  # an older name (a results script, docs/results/endpoint/*/seed_drift.py, imports it)


@dataclass(frozen=True)
class GoodputConfig:
    """Settings of :class:`GoodputController` (see the module docstring for how each is used)."""

    k_max: int = 8
    k_init: int = 2
    min_gain: float = 1.0
    forget: float = 0.9
    plain_forget: float = 0.98
    shrink: float = 2.0
    prior: float = 0.5
    carry: float = 0.5
    window: int = 9
    probe_init: int = 6
    probe_max: int = 48
    confidence_stop: bool = True
    horizon: int = 16
    probe_budget: float = 8.0
    probe_share: float = 0.25
    depth_probe: bool = True
    price_forced: bool = True
    forced_apart: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.k_init <= self.k_max:
            raise ConfigError(f"need 1 <= k_init <= k_max, got {self.k_init}, {self.k_max}")
        if self.min_gain <= 0:
            raise ConfigError(f"min_gain must be > 0, got {self.min_gain}")
        for name in ("forget", "plain_forget", "carry", "prior"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.shrink <= 0 or self.window < 1:
            raise ConfigError("need shrink > 0 and window >= 1")
        if not 1 <= self.probe_init <= self.probe_max:
            raise ConfigError("need 1 <= probe_init <= probe_max")
        if self.horizon < 1 or self.probe_budget < 0 or self.probe_share < 0:
            raise ConfigError("need horizon >= 1, probe_budget >= 0 and probe_share >= 0")


class GoodputController(Controller):
    """Chooses (drafter, K) by maximising predicted tokens per second against plain decoding."""

    name = "goodput"

    def __init__(self, config: GoodputConfig | None = None, **overrides) -> None:
        base = config or GoodputConfig()
        self.config = GoodputConfig(**{**base.__dict__, **overrides}) if overrides else base
        self.costs = MeasuredCosts(self.config.window)
        self.acceptance: dict[str, Acceptance] = {}
        self.calibration = Calibration()  # P(accept | draft probability q), for the stop within a step
        self.stoppable: set[str] = set()  # drafters that consult the stop rule (model drafters do, lookups not)
        self._q: list[float] = []
        self._reach = 1.0
        self._thresholds: list[float] | None = None
        self.context_len = 0
        self.last_choice: tuple[str | None, int, float, float] = (None, 0, 0.0, 0.0)  # drafter, K, G, G(plain)
        self.planned: tuple[float, float] = (0.0, 0.0)  # the last decision's draft ms per token and catch-up ms
        # per drafter, across requests: steps it was chosen since it last drafted beyond its K, and how many such
        # steps before its depth is probed again
        self.shallow: dict[str, int] = {}
        self.depth_gap: dict[str, int] = {}
        self.reset()

    def reset(self) -> None:
        for acc in self.acceptance.values():
            acc.scale(self.config.carry)
        self._plan: tuple[str | None, int] | None = None
        self.forced = 0  # the engine tells it before each step (set_forced)
        self.synced: dict[str, int] = {}  # per drafter: tokens of this request's sequence it has seen
        self.catch_up: dict[str, int] = {}  # per drafter with a bounded catch-up: the most tokens it feeds at once
        self.fresh = True  # no step of this request seen yet: the context length is unknown
        self.plain_run = 0  # steps since the last speculative step
        self.request_ms = 0.0  # time of this request's steps so far
        self.idle: dict[str, int] = {}  # per drafter: steps it could have drafted since it last did
        self.probe_gap: dict[str, int] = {}  # per drafter: idle steps before it is probed again
        # on a probe: the probed drafter, the rate it must beat (ms per token) and the gaps a win resets
        self.probing: tuple[str, float, dict[str, int]] | None = None

    def set_synced(self, synced: Mapping[str, int], catch_up: Mapping[str, int] | None = None) -> None:
        """At a request's start: per drafter, the leading tokens of the sequence it already holds (a draft model
        keeps its cache across requests that share a prefix), so its catch-up counts only the tokens it lacks; and
        per drafter whose catch-up is bounded, the most tokens it feeds at once (it restarts from the sequence's
        last tokens beyond that)."""
        self.synced.update(synced)
        self.catch_up.update(catch_up or {})

    def set_forced(self, n: int) -> None:
        """The grammar forces the next step's first ``n`` tokens: the step emits them (α = 1) and verifies them
        ahead of its K, so :meth:`decide` prices K and plain alike behind them (``price_forced``; off: ignored)."""
        self.forced = n if self.config.price_forced else 0

    def seed_verify_costs(self, curve: Mapping[int, float], context_len: int, *,
                          level_from_steps: bool = True) -> None:
        self.costs.seed_verify(dict(curve), context_len, level_from_steps=level_from_steps)

    def seed_draft_costs(self, costs: Mapping[str, tuple[float, float]]) -> None:
        """Per drafter name, ``(draft_ms, feed_ms)`` per token measured elsewhere (see
        :meth:`MeasuredCosts.seed_draft`): a drafter seeded so is priced from its first proposal on, instead of tried
        once blind at ``k_init``."""
        for name, (draft_ms, feed_ms) in costs.items():
            self.costs.seed_draft(name, draft_ms, feed_ms)

    def draft_costs(self) -> dict[str, tuple[float, float]]:
        """``{drafter: (draft_ms, feed_ms)}`` per token for the drafters whose costs this controller has measured
        (a draft time per token from its own steps, and a catch-up time measured or seeded; never the guess
        :meth:`MeasuredCosts.feed_ms` falls back on), at the last step's context bucket: what
        :meth:`seed_draft_costs` of a new request's controller takes."""
        b = bucket_of(self.context_len)
        out = {}
        for name in self.costs.draft:
            draft_ms = self.costs.draft_ms(name, b)
            if draft_ms and (name in self.costs.feed or name in self.costs.draft_seed):
                out[name] = (draft_ms, self.costs.feed_ms(name, b))
        return out

    def calibrate(self, backend: Backend, context_len: int = 0, widths: Sequence[int] = DEFAULT_WIDTHS,
                  repeats: int = 3) -> dict[int, float]:
        """Measure the target's verification curve on ``backend`` (see
        :func:`~adaspec.backends.costcurve.measure_verify_curve`; its cache is left as it was) and seed the cost
        model with it at the measured context length. Returns the curve, ``{n: ms}`` (empty when the context
        window leaves no room to measure)."""
        at = max(backend.seq_len, context_len)
        widths = [n for n in widths if at + n <= backend.max_context]  # no room for a width: not measured
        if not widths:
            return {}
        curve = measure_verify_curve(backend, widths, context_len=at, repeats=repeats)
        self.costs.seed_verify(curve, at)
        return curve

    # Decisions --------------------------------------------------------------------------------------------
    def choose_drafter(self, options: Mapping[str, int | None]) -> str | None:
        """Called by the engine with a MultiDrafter: ``options`` maps each sub-drafter to the tokens it can
        propose now (0 = none, None = unlimited). Returns the drafter to use, None for a plain step."""
        self._plan = self.decide(options)
        return self._plan[0]

    def next_k(self) -> int:
        plan = self._plan if self._plan is not None else self.decide(None)
        self._plan = None
        return plan[1]

    def decide(self, options: Mapping[str, int | None] | None) -> tuple[str | None, int]:
        """(drafter, K) for the next step; (None, 0) = plain. Without ``options`` every drafter seen so far is a
        candidate (a single drafter's name is learnt from the first speculative step)."""
        c = self.config
        self.planned = (0.0, 0.0)
        self.probing = None
        if not self.costs.measured or self.fresh:  # a request's first step is plain: it tells the context length
            return None, 0
        if options is None:
            options = {name: None for name in {*self.costs.draft, *self.costs.unsteady, *self.costs.draft_seed}} \
                or {"": None}
        b, f = bucket_of(self.context_len), self.forced
        plain_ms = self.costs.plain_step_ms(b)
        base_ms = self.costs.plain_step_ms(b, f) / (f + 1)  # ms per token of a step that drafts nothing of its own
        best: tuple[float, str | None, int, float] = (0.0, None, 0, 0.0)
        candidates: dict[str, tuple[float, int, float]] = {}  # name -> its best (gain, K, catch-up)
        optimistic: dict[str, tuple[float, int]] = {}  # name -> its best (gain, K) were every draft accepted
        for name, cap in options.items():
            k_top = c.k_max if cap is None else min(c.k_max, cap)
            if k_top <= 0:
                continue
            per_token = self.costs.draft_ms(name, b)
            if per_token is None:  # never measured without catch-up: try it (the try after a first one is steady)
                return name, min(c.k_init, k_top)
            behind = self._lag(name, self.context_len)
            catch_up = self.costs.feed_ms(name, b) * max(behind - MeasuredCosts.STEADY, 0)
            alphas = self._behind(name, f).rates()
            for k in range(1, k_top + 1):
                step_ms = self.costs.spec_step_ms(k, b, name, catch_up / c.horizon, f)
                gain = (f + expected_tokens(alphas, k)) / step_ms
                if gain > candidates.get(name, (0.0,))[0]:
                    candidates[name] = (gain, k, catch_up)
                if (f + k + 1) / step_ms > optimistic.get(name, (0.0,))[0]:
                    optimistic[name] = ((f + k + 1) / step_ms, k)
                if gain > best[0]:
                    best = (gain, name, k, catch_up)
        gain, name, k, catch_up = best
        self.last_choice = (name, k, gain, 1.0 / base_ms)
        if name is None:
            return None, 0
        for other in candidates:  # every drafter that could draft now and (unless chosen below) does not
            self.idle[other] = self.idle.get(other, 0) + 1
        if gain >= c.min_gain / base_ms:
            # A drafter that has sat out its probe gap and would beat the chosen one if all its drafts were accepted
            # (a free lookup with a long match, say) is probed instead, judged against the chosen one's rate: a
            # drafter that pays must not keep another that may pay more from ever being measured again.
            for other, (best_case, k_other) in sorted(optimistic.items(), key=lambda kv: kv[1], reverse=True):
                gap = self._probe_gap(other)
                if other != name and best_case > gain and self.idle[other] > gap \
                        and candidates[other][2] <= self._probe_allowance(plain_ms):
                    self.idle[other], self.probe_gap[other] = 0, self._next_gap(gap)
                    self.probing = (other, 1.0 / gain, self.probe_gap)
                    self.planned = (self.costs.draft_ms(other, b) or 0.0, candidates[other][2])
                    return self._probe(other, k_other, 1.0 / gain, b, options[other])
            self.plain_run, self.idle[name], self.probe_gap[name] = 0, 0, c.probe_init
            self.planned = (self.costs.draft_ms(name, b) or 0.0, catch_up)
            depth = self._probe_depth(name, k, optimistic[name], gain)
            if depth:
                self.probing = (name, 1.0 / gain, self.depth_gap)
                return self._probe(name, depth, 1.0 / gain, b, options[name])
            return self._speculate(name, k, gain, b, options[name])
        self.plain_run += 1
        # Nothing pays now. Probe (at its best K, not extended) the most promising drafter that has sat out more
        # than its probe gap -- counted per drafter, so a free n-gram drafter that pays now and then does not keep
        # the draft model from ever being re-measured -- unless its catch-up would cost more than plain steps.
        for gain, name, k, catch_up in sorted(((g, n, kk, cu) for n, (g, kk, cu) in candidates.items()),
                                              reverse=True):
            gap = self._probe_gap(name)
            if self.idle[name] > gap and catch_up <= self._probe_allowance(plain_ms):  # else: as soon as allowed
                self.idle[name], self.probe_gap[name] = 0, self._next_gap(gap)
                self.probing = (name, base_ms, self.probe_gap)
                self.planned = (self.costs.draft_ms(name, b) or 0.0, catch_up)
                return self._probe(name, k, base_ms, b, options[name])
        return None, 0

    def _lag(self, name: str, length: int) -> int:
        """Tokens ``name`` feeds before drafting after a sequence of ``length``: those it has not seen, at most its
        bounded catch-up."""
        lag = length - self.synced.get(name, 0)
        cap = self.catch_up.get(name)
        return lag if cap is None else min(lag, cap)

    def _probe_gap(self, name: str) -> int:
        """Steps ``name`` must sit out before it is probed: its probe gap, or none for a drafter never observed (no
        acceptance record, not even one carried from an earlier request: its α is the prior, a guess that one
        probe replaces with a measurement)."""
        if name not in self.probe_gap and not self._behind(name, self.forced).reached[0]:
            return 0
        return self.probe_gap.get(name, self.config.probe_init)

    def _next_gap(self, gap: int) -> int:
        """The probe gap after a probe at ``gap``: doubled (up to ``probe_max``); ``probe_init`` after a first one."""
        return min(2 * gap, self.config.probe_max) if gap else self.config.probe_init

    def _probe_depth(self, name: str, k: int, optimistic: tuple[float, int], gain: float) -> int:
        """The K at which this step probes the chosen drafter beyond its best ``k`` (0: no probe): min(best-case K,
        2k + 1) when the position after k has fewer observations than ``shrink`` (its α is mostly the position
        before it, shrunk, not measured), drafting deeper would beat the plan were every draft accepted, and the
        drafter was chosen more than its depth gap (``probe_init`` steps, doubling up to ``probe_max`` while depth
        probes lose) since it last drafted deeper. (2k + 1, not the best case: a probe that loses costs a few
        tokens' verification, not k_max's.)
        Without it a lookup drafter whose matches are all-or-nothing (a repeated answer is accepted to its end)
        keeps a small K that its first positions' mixed record prices, and never measures how far it runs."""
        c = self.config
        best_case, k_deep = optimistic
        if not c.depth_probe:
            return 0
        reached = self._behind(name, self.forced).reached  # the record this step's plan was priced on
        if k_deep <= k or best_case <= gain or k >= len(reached) or reached[k] >= c.shrink:
            self.shallow[name] = 0
            return 0
        gap = self.depth_gap.get(name, c.probe_init)
        self.shallow[name] = self.shallow.get(name, 0) + 1
        if self.shallow[name] <= gap:
            return 0
        self.shallow[name], self.depth_gap[name] = 0, min(2 * gap, c.probe_max)
        return min(k_deep, 2 * k + 1)

    def _probe(self, name: str, k: int, baseline_ms: float, b: int, cap: int | None) -> tuple[str, int]:
        """A probe's plan. A probe is there to measure how deep the drafter's acceptance runs, so a drafter that
        consults the stop rule drafts on (up to k_max) while its own calibrated confidence says the next token is
        worth more than the baseline's rate (one token per ``baseline_ms``: a plain step's, or the step it
        displaces), with the positional acceptance it has not yet measured taken as 1; others are probed at their
        best K. (Probing at the best K under the shrunk acceptance alone drafts one token and never observes the
        later positions, so a draft model that agrees with the target stays unused.)"""
        return self._plan_stop(name, k, 1.0 / baseline_ms, b, cap, measured=False)

    def _stop_thresholds(self, name: str, gain: float, b: int, k_top: int, alphas: list[float]) -> list[float]:
        """Per draft position j, the calibrated probability that tokens 0..j are all accepted below which drafting
        on to any later token m would lower the step's tokens per millisecond under ``gain``:
        min over m > j of gain · ((m − j) t_d + t_v(m + 2) − t_v(j + 2)) / Σ_{i=j+1..m} Π_{l=j+1..i} α[l].
        (Looking beyond the next token matters where the verification curve is not convex: on a CPU one more
        token can cost a step's worth while the few after it are cheap.)"""
        per_token = self.costs.marginal_draft_ms(name, b) if self.costs.draft_ms(name, b) else 0.0
        f = self.forced  # the step verifies the grammar's forced tokens ahead of the draft
        verify = [self.costs.verify_ms(f + n, b) for n in range(1, k_top + 2)]  # verify[n - 1] = t_v(f + n)
        out = []
        for j in range(k_top - 1):
            best, reach, tokens = float("inf"), 1.0, 0.0
            for m in range(j + 1, k_top):
                reach *= alphas[m]
                tokens += reach
                cost = (m - j) * per_token + max(verify[m + 1] - verify[j + 1], 0.0)
                best = min(best, gain * cost / max(tokens, 1e-6))
            out.append(best)
        return out

    def _probe_allowance(self, plain_ms: float) -> float:
        """Milliseconds a probe may spend catching its drafter up: a share (``probe_share``) of what this request
        has cost so far, at least one plain step and at most ``probe_budget`` plain steps. Exploring in proportion
        to the time already spent (the ski-rental rule) keeps a short request from paying a draft model's prefill
        it cannot earn back, while a long one soon affords it."""
        c = self.config
        return min(c.probe_budget * plain_ms, max(plain_ms, c.probe_share * self.request_ms))

    def _speculate(self, name: str, k: int, gain: float, b: int, cap: int | None) -> tuple[str, int]:
        """The step's plan. With the confidence stop and a drafter that consults it, the draft may run to k_max
        and stops after token j once the calibrated probability that tokens 0..j all get accepted is below every
        threshold of :meth:`_stop_thresholds`: drafting on to any later token would lower the step's expected
        tokens per millisecond."""
        return self._plan_stop(name, k, gain, b, cap, measured=True)

    def _plan_stop(self, name: str, k: int, gain: float, b: int, cap: int | None, measured: bool) -> tuple[str, int]:
        """``(name, k)`` without the stop rule (off, or ``name`` does not consult it); else ``(name, k_top)``, the
        draft cut by the stop thresholds under ``gain`` tokens per ms, with the drafter's positional acceptance
        (``measured``) or every position's taken as 1."""
        self._thresholds = None
        if not (self.config.confidence_stop and name in self.stoppable):
            return name, k
        k_top = self.config.k_max if cap is None else min(self.config.k_max, cap)
        alphas = self._behind(name, self.forced).rates() if measured else [1.0] * k_top
        self._thresholds = self._stop_thresholds(name, gain, b, k_top, alphas)
        return name, k_top

    def draft_stop(self) -> DraftStop | None:
        if not self.config.confidence_stop:
            return None

        def stop(position: int, probs: torch.Tensor, token: int) -> bool:
            if position == 0:
                self._q.clear()
                self._reach = 1.0
            q = float(probs[token])
            self._q.append(q)
            self._reach *= self.calibration(q)
            thresholds = self._thresholds
            return thresholds is not None and position < len(thresholds) and self._reach < thresholds[position]

        return stop

    def _judge_probe(self, step: StepRecord, name: str, baseline_ms: float, gaps: dict[str, int]) -> None:
        """A probe that beat its baseline (one token per ``baseline_ms``; tokens per millisecond of its drafting, at
        the steady draft cost, and verification) resets the drafter's gap in ``gaps`` (its probe gap, or its depth
        gap for a depth probe): a gap doubles only while the drafter keeps losing."""
        b = bucket_of(step.context_len)
        drafting = (self.costs.draft_step_ms(step.drafted, b, name) + step.forced * self.costs.feed_ms(name, b)
                    if self.costs.draft_ms(name, b) else step.draft_ms)  # as decide() priced it
        cost = drafting + step.verify_ms + self.costs.overhead_ms()
        if step.emitted / cost >= self.config.min_gain / baseline_ms:
            gaps[name] = self.config.probe_init

    def _behind(self, name: str, forced: int) -> Acceptance:
        """``name``'s acceptance for a draft behind ``forced`` of the grammar's forced tokens: with ``forced_apart``
        and forced tokens, counted apart from its other drafts (they continue a forced run, where the next token
        is often all but forced: a quote or bracket the grammar allows in more than one spelling), its prior
        position 0 being ``name``'s own α there when first seen; else ``name``'s."""
        if not (forced and self.config.forced_apart):
            return self._acceptance(name)
        key = f"{name}|forced"
        if key not in self.acceptance:
            c = self.config
            self.acceptance[key] = Acceptance(c.k_max, c.forget, c.shrink, self._acceptance(name).rates()[0])
        return self.acceptance[key]

    def _acceptance(self, name: str) -> Acceptance:
        if name not in self.acceptance:
            c = self.config
            self.acceptance[name] = Acceptance(c.k_max, c.forget, c.shrink, c.prior)
        return self.acceptance[name]

    def update(self, step: StepRecord) -> None:
        if not self.config.price_forced:
            step = dataclasses.replace(step, forced=0)  # as before the forced tokens were priced: width unknown
        # a drafter behind forced tokens fed them first (a catch-up the plan prices per step)
        behind = self._lag(step.drafter, step.context_len + step.forced) if step.drafted else 0
        self.costs.observe(step, behind)
        if step.drafted and self.probing is not None and self.probing[0] == step.drafter:
            self._judge_probe(step, *self.probing)
        self.probing = None
        if step.drafted:  # it has fed the context and its drafts but the last; those past the rejection are gone
            self.synced[step.drafter] = step.context_len + step.forced + min(step.drafted - 1, step.accepted)
        self.context_len = step.context_len + step.emitted
        self.request_ms += step.total_ms
        self.fresh = False
        if step.drafted:
            self._behind(step.drafter, step.forced).observe(step.depth, step.accepted)  # a tree: along its path
            if self._q:  # this drafter asked the stop rule about its tokens
                self.stoppable.add(step.drafter)
                self.calibration.observe(self._q, step.drafted, step.accepted)
        else:  # evidence about acceptance ages while nothing is drafted, so a probe weighs more
            for acc in self.acceptance.values():
                acc.scale(self.config.plain_forget)
        self._q.clear()
        self._thresholds = None
