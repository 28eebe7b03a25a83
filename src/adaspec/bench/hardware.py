"""Roofline hardware profiles: predict the cost of verifying n tokens and of drafting, for a model shape on a
machine described by a few numbers, and check the predictions against measurements and published speedups.

A forward over n new tokens after L cached ones, for a model of shape S in a dtype of b bytes per weight, costs on
the device (Williams et al. 2009, "Roofline: an insightful visual performance model", applied per forward)

    t_device(n, L) = max( bytes(n, L) / (BW η_bw),  flops(n, L) / (P η_mm) )
    bytes(n, L)    = S.matmul_params b  +  S.kv_bytes_per_token L          (weights once, the KV cache once)
    flops(n, L)    = 2 S.matmul_params n  +  4 layers heads head_dim n (L + (n + 1) / 2)

with BW the peak memory bandwidth, P the peak dense matrix throughput at the dtype, and η the fractions of peak
that decoding kernels reach. The host must also issue the work: eager PyTorch dispatches every operator from
Python, which costs a roughly fixed time per decoder layer, so

    T(n, L) = max(t_device(n, L), layers h_layer) + h_forward      (GPU: launches overlap host and device)
    T(n, L) = t_device(n, L) + layers h_layer + h_forward          (CPU: the same cores do both, in turn)

A measured CPU profile prices the matrices from curves timed on the machine (a decoder layer's products in model
order, the LM head) and the rest of the forward from the real model with its matrices stood in for
(:func:`~adaspec.bench.hardware_measure.measure_overhead_curve`): T(n, L) = layers layer(n) + head(n) +
overhead(n, L). On a GPU at batch 1 the weight term dominates and T(K + 1, L) ≈ T(1, L): verification is nearly free,
which is where speculation's 2–3× lives. On a small CPU the flops term overtakes it after a few tokens (verify(5) ≈ 3
steps with bf16 on AVX2).

The predicted costs fill a :class:`~adaspec.bench.costmodel.FittedCostModel` (the cost model the measured study
uses), so every prediction — speedup(α, K, L), the boundary α, the best K — comes from one code path.

Profiles come from spec sheets (:data:`PROFILES`, each with its source) or from measurements of the machine at hand
(:func:`~adaspec.bench.hardware_measure.measure_profile`: streaming bandwidth and matrix throughput at decoding
widths, timed with PyTorch). The host overhead h_layer of eager PyTorch is not on any spec sheet:
:func:`~adaspec.bench.hardware_measure.measure_dispatch_ms` times it with a model so narrow that its arithmetic is
negligible (on this machine's CPU; a GPU server's host adds launch latency on top, so GPU predictions use the value
stated in the profile).
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, replace

from adaspec.bench.costmodel import FittedCostModel
from adaspec.errors import ConfigError
from adaspec.models.synthetic import ModelShape

BYTES_PER_PARAM = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0, "q4_k_m": 4.85 / 8, "q8_0": 8.5 / 8}
"""Bytes per weight by dtype (GGUF quantisations: bits per weight / 8, block scales included)."""

EAGER_LAYER_MS = 0.45
"""Host time per decoder layer of eager PyTorch on a GPU server (Python dispatch plus about 30 kernel launches of
~10 µs each in a Llama/Qwen2 layer). Not a spec-sheet number: replace it with
:func:`~adaspec.bench.hardware_measure.measure_dispatch_ms` on the machine (``adaspec map --hardware ... --layer-ms``).
CUDA graphs or a compiled engine (vLLM, SGLang) bring it near 0."""


@dataclass(frozen=True)
class HardwareProfile:
    """A machine as the roofline model sees it.

    Attributes:
        name: a key of :data:`PROFILES`, or ``"this-cpu"`` for a measured profile.
        kind: ``"gpu"`` or ``"cpu"``.
        bandwidth_gbs: peak memory bandwidth, GB/s (10^9 bytes per second).
        matmul_tflops: peak dense matrix throughput at 16-bit precision (GPU tensor cores, FP32 accumulate), or
            the measured throughput at decoding widths (CPU), TFLOP/s.
        memory_gib: device memory, GiB (what fits).
        bandwidth_efficiency, matmul_efficiency: fractions of peak that decoding kernels reach (η_bw, η_mm).
        layer_ms: host time per decoder layer per forward (h_layer), ms.
        forward_ms: fixed host time per forward (sampling, synchronisation), ms.
        source: where the numbers come from (spec sheet, or "measured on ...").
        measured: the numbers were measured on the machine at hand.
        matmul_curve: measured ``(n, ms per 10^9 weights)`` of the framework's linear layer at n tokens, weights
            streamed from memory (:func:`~adaspec.bench.hardware_measure.measure_profile`). Where given it replaces
            the two-number roofline for the weights: CPU kernels change with the width (a one-token GEMV reaches a
            fraction of the streaming bandwidth, small GEMMs a width-dependent throughput), which two numbers cannot
            describe.
        linear_curves: measured ``((out_features, in_features), ((n, ms per 10^9 weights), ...))`` per matrix
            shape (:func:`~adaspec.bench.hardware_measure.measure_profile` with ``shapes``). Where every matrix of a
            model has one, the model's weights are priced matrix by matrix instead of by ``matmul_curve``: CPU GEMM
            kernels run a 896-wide projection, a 4864-wide MLP and a 151,936-row LM head at different speeds per
            weight and with differently shaped curves in n (Qwen2.5-0.5B fp32 on 2 AVX2 cores: T(9)/T(1) = 2.7 for
            the model against 6.0 for a 2560 x 10240 probe).
        linear_call_ms: host time of one linear-layer call (dispatch), ms; included in ``linear_curves``, so taken
            out of ``layer_ms`` (7 linear calls per decoder layer) when they price a model.
        layer_curves: measured ``(layer matrices, ((n, ms per layer), ...))``: a decoder layer's seven matrix
            products run in model order (:meth:`ModelShape.layer_matrices`), layers streamed from memory
            (:func:`~adaspec.bench.hardware_measure.measure_layer_curve`). Where a model's layer has one (and its LM
            head a ``linear_curves`` entry), its weights cost ``layers × curve(n) + head``: on this CPU in fp32 the
            same matrices cost about 20 % more interleaved by shape, as a forward runs them, than streamed one shape
            at a time.
        overhead_curves: measured ``(shape, ((n, L, ms per forward), ...))``: everything of a forward of that
            :class:`ModelShape` but its matrix products, at n tokens after L cached
            (:func:`~adaspec.bench.hardware_measure.measure_overhead_curve`).
            Where a CPU profile has one for a model priced by ``layer_curves``, a batch-1 forward costs
            ``matrices + overhead(n, L)``, replacing the host term ``layers × h_layer`` and the KV-cache read
            (both inside it): a 64-wide probe model's dispatch misses the cache update, attention and the masks
            of multi-token forwards at the real widths (on 2 threads of an AVX-512 Xeon, the median error of the
            Qwen2.5-0.5B fp32 forwards went from 10.7 to 7.9 %; bf16 stays near 14 %, see docs/hardware.md).
    """

    name: str
    kind: str
    bandwidth_gbs: float
    matmul_tflops: float
    memory_gib: float
    bandwidth_efficiency: float = 0.8
    matmul_efficiency: float = 0.5
    layer_ms: float = EAGER_LAYER_MS
    forward_ms: float = 1.0
    source: str = ""
    measured: bool = False
    matmul_curve: tuple[tuple[int, float], ...] = ()
    linear_curves: tuple[tuple[tuple[int, int], tuple[tuple[int, float], ...]], ...] = ()
    linear_call_ms: float = 0.0
    layer_curves: tuple[tuple[tuple[tuple[int, int], ...], tuple[tuple[int, float], ...]], ...] = ()
    overhead_curves: tuple[tuple[ModelShape, tuple[tuple[int, int, float], ...]], ...] = ()

    def linear_ms(self, s: ModelShape, n: float) -> float | None:
        """Time of all of ``s``'s matrix products over ``n`` tokens, ms: from :attr:`layer_curves` (a layer's
        sequence) plus the LM head's :attr:`linear_curves` entry where both exist, else matrix by matrix from
        :attr:`linear_curves`; None when a matrix of ``s`` has no measured curve."""
        curves = dict(self.linear_curves)
        if not curves:
            return None
        head = (s.vocab, s.hidden)
        layer = dict(self.layer_curves).get(s.layer_matrices())
        if layer is not None and head in curves:
            return s.layers * _interpolate(layer, n) + _interpolate(curves[head], n) * head[0] * head[1] / 1e9
        total = 0.0
        for dims, count in s.matrices().items():
            if dims not in curves:
                return None
            total += count * _interpolate(curves[dims], n) * dims[0] * dims[1] / 1e9
        return total

    # The roofline -----------------------------------------------------------------------------------------------
    def forward_time_ms(self, s: ModelShape, n: float, context: float, *, dtype: str = "bfloat16",
                        batch: int = 1) -> float:
        """Predicted wall time of one forward over ``n`` new tokens per row for ``batch`` rows after ``context``
        cached tokens each, ms (see the module docstring)."""
        b = bytes_per_param(dtype)
        kv = 2.0 if b < 4 else 4.0  # the KV cache is kept in the activation dtype (16-bit for quantised weights)
        kv_bytes = batch * s.kv_bytes_per_token(kv) * context
        linear = self.linear_ms(s, batch * n)
        overhead = dict(self.overhead_curves).get(s)
        if (linear is not None and overhead and batch == 1 and self.kind == "cpu"
                and s.layer_matrices() in dict(self.layer_curves)):  # matrices + the rest, both measured
            return linear + _interpolate_2d(overhead, n, context) + self.forward_ms
        host_layer = self.layer_ms
        if linear is not None:  # measured per matrix shape (dispatch included), plus reading the KV cache
            device = linear + kv_bytes / (self.bandwidth_gbs * 1e9 * self.bandwidth_efficiency) * 1e3
            host_layer = max(self.layer_ms - 7 * self.linear_call_ms, 0.0)
        elif self.matmul_curve:  # measured linear-layer times per width, plus reading the KV cache
            device = (_interpolate(self.matmul_curve, batch * n) * s.matmul_params / 1e9
                      + kv_bytes / (self.bandwidth_gbs * 1e9 * self.bandwidth_efficiency) * 1e3)
        else:
            moved = s.weight_bytes(b) + kv_bytes
            flops = batch * s.flops(n, context)
            device = max(moved / (self.bandwidth_gbs * 1e9 * self.bandwidth_efficiency),
                         flops / (self.matmul_tflops * 1e12 * self.matmul_efficiency)) * 1e3
        host = s.layers * host_layer
        # a GPU runs asynchronously to its host, so the slower of the two sets the pace; a CPU does both in turn
        return (max(device, host) if self.kind == "gpu" else device + host) + self.forward_ms

    def fits(self, s: ModelShape, dtype: str = "bfloat16") -> bool:
        """The weights fit in the device memory (with 10 % left for the KV cache and activations)."""
        return s.total_params * bytes_per_param(dtype) <= 0.9 * self.memory_gib * 2**30

    def cost_model(self, target: ModelShape, drafts: dict[str, ModelShape] | None = None, *,
                   dtype: str = "bfloat16", lookup_ms: float = 0.1, k_max: int = 16) -> FittedCostModel:
        """A :class:`FittedCostModel` whose curves are this profile's predictions, evaluated exactly (no fit):
        T_v(n, L) = :meth:`forward_time_ms` of ``target``, each draft's T_d(L) its one-token forward, and the
        drafter ``ngram-lookup`` at ``lookup_ms`` per token."""
        return RooflineCostModel(self, target, drafts or {}, dtype=dtype, lookup_ms=lookup_ms, k_max=k_max)

    def to_dict(self) -> dict:
        return asdict(self)


class RooflineCostModel(FittedCostModel):
    """The cost model with predicted curves (see :meth:`HardwareProfile.cost_model`); speedup, boundary α and
    best K come from the base class."""

    def __init__(self, prof: HardwareProfile, target: ModelShape, drafts: dict[str, ModelShape], *, dtype: str,
                 lookup_ms: float, k_max: int) -> None:
        super().__init__({n: (0.0, 0.0) for n in range(1, k_max + 2)}, {d: (0.0, 0.0) for d in drafts})
        self.draft["ngram-lookup"] = (lookup_ms, 0.0)
        self.profile, self.target, self.drafts, self.dtype, self.lookup_ms = prof, target, drafts, dtype, lookup_ms

    def verify_ms(self, n: float, context: float) -> float:
        return self.profile.forward_time_ms(self.target, n, context, dtype=self.dtype)

    def draft_ms(self, drafter, context: float) -> float:
        if drafter in self.drafts:
            return self.profile.forward_time_ms(self.drafts[drafter], 1, context, dtype=self.dtype)
        return super().draft_ms(drafter, context)


def _interpolate(curve: tuple[tuple[int, float], ...], n: float) -> float:
    """Linear interpolation in n over a measured ``(n, value)`` curve; beyond its ends, proportional to n (the
    compute-bound limit) above and flat below."""
    pts = sorted(curve)
    if n <= pts[0][0]:
        return pts[0][1]
    for (n0, v0), (n1, v1) in zip(pts, pts[1:]):
        if n <= n1:
            return v0 + (v1 - v0) * (n - n0) / (n1 - n0)
    return pts[-1][1] * n / pts[-1][0]


def bytes_per_param(dtype: str) -> float:
    """Bytes per weight of ``dtype`` (see :data:`BYTES_PER_PARAM`); ConfigError naming the choices."""
    try:
        return BYTES_PER_PARAM[dtype.lower()]
    except KeyError:
        raise ConfigError(f"unknown dtype {dtype!r} for the roofline model; choose one of "
                          f"{', '.join(BYTES_PER_PARAM)}") from None


PROFILES: dict[str, HardwareProfile] = {p.name: p for p in (
    HardwareProfile("rtx-3090", "gpu", 936, 71, 24,
                    source="NVIDIA Ampere GA102 GPU architecture whitepaper (2020): 936 GB/s GDDR6X; 71 TFLOPS peak "
                           "FP16/BF16 tensor with FP32 accumulate (dense)"),
    HardwareProfile("rtx-4090", "gpu", 1008, 165.2, 24,
                    source="NVIDIA Ada GPU architecture whitepaper (2022): 1008 GB/s GDDR6X; 165.2 TFLOPS peak "
                           "FP16/BF16 tensor with FP32 accumulate (dense)"),
    HardwareProfile("a100-80gb", "gpu", 2039, 312, 80,
                    source="NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB): 2,039 GB/s HBM2e; 312 TFLOPS "
                           "BF16/FP16 tensor (dense)"),
    HardwareProfile("h100-sxm", "gpu", 3350, 989, 80,
                    source="NVIDIA H100 Tensor Core GPU datasheet (SXM5): 3.35 TB/s HBM3; 1,979 TFLOPS BF16 tensor "
                           "with sparsity, 989 dense"),
    HardwareProfile("h200", "gpu", 4800, 989, 141,
                    source="NVIDIA H200 Tensor Core GPU datasheet (SXM): 4.8 TB/s HBM3e, 141 GB; 1,979 TFLOPS BF16 "
                           "tensor with sparsity, 989 dense"),
    HardwareProfile("laptop-cpu", "cpu", 120, 0.9, 32, bandwidth_efficiency=0.6, matmul_efficiency=0.3,
                    layer_ms=0.08, forward_ms=0.5,
                    source="Intel Core Ultra 7 155H (ark.intel.com): 120 GB/s maximum memory bandwidth "
                           "(LPDDR5x-7467); matrix throughput not on the sheet: 6 P-cores x 2 AVX2 FMA units x 8 fp32 "
                           "lanes x 2 flops x 4.8 GHz = 0.92 TFLOP/s fp32 peak (derived, E-cores left out); host "
                           "time per layer assumed"),
)}
"""Named devices, from their spec sheets (see each ``source``). GPU profiles assume eager PyTorch
(:data:`EAGER_LAYER_MS`); pass ``layer_ms`` for a compiled engine."""


def profile(name: str, **overrides) -> HardwareProfile:
    """The named profile (a :data:`PROFILES` key, case-insensitive), with fields overridden.

    Raises:
        ConfigError: an unknown name (the message lists the choices).
    """
    key = name.strip().lower()
    if key not in PROFILES:
        raise ConfigError(f"unknown hardware {name!r}; choose one of {', '.join(PROFILES)} (or measure this "
                          "machine: --hardware this-cpu)")
    return replace(PROFILES[key], **{k: v for k, v in overrides.items() if v is not None})




def _interpolate_2d(curve: tuple[tuple[int, int, float], ...], n: float, context: float) -> float:
    """An ``((n, L, value), ...)`` curve at ``(n, context)``: :func:`_interpolate` in n at each measured L, then
    linear in L (extrapolated linearly beyond the measured contexts, never below zero; flat in L when the curve has
    one context). Every context should have the same widths."""
    by_l: dict[int, list[tuple[int, float]]] = {}
    for ni, li, v in curve:
        by_l.setdefault(li, []).append((ni, v))
    pts = sorted((li, _interpolate(tuple(c), n)) for li, c in by_l.items())
    if len(pts) == 1:
        return pts[0][1]
    i = min(max(bisect.bisect_left([li for li, _ in pts], context), 1), len(pts) - 1)  # the segment, or an end one
    (l0, v0), (l1, v1) = pts[i - 1], pts[i]
    return max(v0 + (v1 - v0) * (context - l0) / (l1 - l0), 0.0)
