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
(:func:`measure_overhead_curve`): T(n, L) = layers layer(n) + head(n) + overhead(n, L).
 On a GPU at batch 1 the
weight term dominates and T(K + 1, L) ≈ T(1, L): verification is nearly free, which is where speculation's 2–3×
lives. On a small CPU the flops term overtakes it after a few tokens (verify(5) ≈ 3 steps with bf16 on AVX2).

The predicted costs fill a :class:`~adaspec.bench.costmodel.FittedCostModel` (the cost model the measured study
uses), so every prediction — speedup(α, K, L), the boundary α, the best K — comes from one code path.

Profiles come from spec sheets (:data:`PROFILES`, each with its source) or from measurements of the machine at hand
(:func:`measure_profile`: streaming bandwidth and matrix throughput at decoding widths, timed with PyTorch). The
host overhead h_layer of eager PyTorch is not on any spec sheet: :func:`measure_dispatch_ms` times it with a model
so narrow that its arithmetic is negligible (on this machine's CPU; a GPU server's host adds launch latency on
top, so GPU predictions use the value stated in the profile).
"""

from __future__ import annotations

import bisect
import math
import statistics
import time
from dataclasses import asdict, dataclass, replace

from adaspec.bench.costmodel import FittedCostModel
from adaspec.errors import ConfigError
from adaspec.models.synthetic import SHAPES, ModelShape

BYTES_PER_PARAM = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0, "q4_k_m": 4.85 / 8, "q8_0": 8.5 / 8}
"""Bytes per weight by dtype (GGUF quantisations: bits per weight / 8, block scales included)."""

EAGER_LAYER_MS = 0.45
"""Host time per decoder layer of eager PyTorch on a GPU server (Python dispatch plus about 30 kernel launches of
~10 µs each in a Llama/Qwen2 layer). Not a spec-sheet number: replace it with :func:`measure_dispatch_ms` on the
machine (``adaspec map --hardware ... --layer-ms``). CUDA graphs or a compiled engine (vLLM, SGLang) bring it near 0."""


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
            streamed from memory (:func:`measure_profile`). Where given it replaces the two-number roofline for the
            weights: CPU kernels change with the width (a one-token GEMV reaches a fraction of the streaming
            bandwidth, small GEMMs a width-dependent throughput), which two numbers cannot describe.
        linear_curves: measured ``((out_features, in_features), ((n, ms per 10^9 weights), ...))`` per matrix
            shape (:func:`measure_profile` with ``shapes``). Where every matrix of a model has one, the model's
            weights are priced matrix by matrix instead of by ``matmul_curve``: CPU GEMM kernels run a 896-wide
            projection, a 4864-wide MLP and a 151,936-row LM head at different speeds per weight and with
            differently shaped curves in n (Qwen2.5-0.5B fp32 on 2 AVX2 cores: T(9)/T(1) = 2.7 for the model
            against 6.0 for a 2560 x 10240 probe).
        linear_call_ms: host time of one linear-layer call (dispatch), ms; included in ``linear_curves``, so taken
            out of ``layer_ms`` (7 linear calls per decoder layer) when they price a model.
        layer_curves: measured ``(layer matrices, ((n, ms per layer), ...))``: a decoder layer's seven matrix
            products run in model order (:meth:`ModelShape.layer_matrices`), layers streamed from memory
            (:func:`measure_layer_curve`). Where a model's layer has one (and its LM head a ``linear_curves``
            entry), its weights cost ``layers × curve(n) + head``: on this CPU in fp32 the same matrices cost about
            20 % more interleaved by shape, as a forward runs them, than streamed one shape at a time.
        overhead_curves: measured ``(shape, ((n, L, ms per forward), ...))``: everything of a forward of that
            :class:`ModelShape` but its matrix products, at n tokens after L cached (:func:`measure_overhead_curve`).
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


# Measuring the machine at hand ------------------------------------------------------------------------------------
def _median_ms(fn, repeats: int, sync) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


LINEAR_WIDTHS = (1, 2, 3, 5, 9, 17)
"""Tokens per forward at which linear layers are timed."""


def measure_linear_curve(out_features: int, in_features: int, *, dtype: str = "float32", device: str = "cpu",
                         widths=LINEAR_WIDTHS, repeats: int = 5, stream_bytes: int = 256 * 2**20,
                         max_copies: int = 4096) -> tuple[tuple[int, float], ...]:
    """Time ``F.linear`` of ``[n, in_features]`` by ``[out_features, in_features]`` weights at each n of ``widths``,
    with the weights streamed from memory as in a forward: enough distinct copies of the matrix (at most
    ``max_copies``) to pass ``stream_bytes``, run one after another, so that none is still in a cache. Returns
    ``((n, ms per 10^9 weights), ...)``, medians of ``repeats`` passes (dispatch included): a one-matrix
    :func:`measure_layer_curve`, per weight."""
    curve = measure_layer_curve(((out_features, in_features),), dtype=dtype, device=device, widths=widths,
                                repeats=repeats, stream_bytes=stream_bytes, max_copies=max_copies)
    return tuple((n, ms / (out_features * in_features / 1e9)) for n, ms in curve)


def measure_layer_curve(matrices: tuple[tuple[int, int], ...], *, dtype: str = "float32", device: str = "cpu",
                        widths=LINEAR_WIDTHS, repeats: int = 5, stream_bytes: int = 256 * 2**20,
                        max_copies: int = 4096) -> tuple[tuple[int, float], ...]:
    """Time a decoder layer's matrix products run in model order (``matrices`` as from
    :meth:`~adaspec.models.synthetic.ModelShape.layer_matrices`: ``F.linear`` of ``[n, in_features]`` by each
    ``[out_features, in_features]``, one after another) at each n of ``widths``, over enough distinct copies of the
    layer (at most ``max_copies``) to pass ``stream_bytes``, so that no weight is still in a cache. Returns
    ``((n, ms per layer), ...)``, medians of ``repeats`` passes (dispatch included).

    Raises:
        ConfigError: ``matrices`` is empty.
    """
    import torch

    from adaspec.backends.torch_backend import resolve_dtype

    if not matrices:
        raise ConfigError("measure_layer_curve needs at least one (out_features, in_features) matrix")
    dt = resolve_dtype(dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    size = sum(o * i for o, i in matrices)
    copies = max(1, min(max_copies, math.ceil(stream_bytes / (size * torch.finfo(dt).bits // 8))))
    layers = [[torch.randn(o, i, dtype=dt, device=device) for o, i in matrices] for _ in range(copies)]
    curve = []
    with torch.inference_mode():
        for n in widths:
            x = {i: torch.randn(n, i, dtype=dt, device=device) for i in {i for _, i in matrices}}

            def run(x=x):
                for layer in layers:
                    for w in layer:
                        torch.nn.functional.linear(x[w.shape[1]], w)

            curve.append((int(n), _median_ms(run, repeats, sync) / copies))
    return tuple(curve)


def measure_linear_call_ms(*, device: str = "cpu", repeats: int = 7, calls: int = 200) -> float:
    """Host time of one ``F.linear`` call on an 8 x 8 matrix (dispatch; its arithmetic is negligible), ms."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    w = torch.randn(8, 8, device=device)
    x = torch.randn(1, 8, device=device)

    def run():
        for _ in range(calls):
            torch.nn.functional.linear(x, w)

    with torch.inference_mode():
        return _median_ms(run, repeats, sync) / calls


OVERHEAD_CONTEXTS = (128, 1024)
"""Cached tokens at which :func:`measure_overhead_curve` times a forward's work besides its matrix products (linear
in the context between and beyond them: the KV cache's copy and attention)."""


def _matmul_free_model(s: ModelShape, dtype, device: str):
    """A transformers model of shape ``s`` whose linear layers (and embedding) return zeros of their output shape
    without multiplying: every other operator of a forward (norms, rotary, attention over the KV cache, the cache's
    update, activations, residuals, the logits' handling) runs as in the real model. Built on the meta device and
    materialised without the matrices, so a 32B shape costs only its norms. Returns ``(model, stubs)``: the
    stand-ins of one layer's seven matrices in model order and of the LM head, for timing their own calls."""
    import torch
    from transformers import AutoModelForCausalLM

    from adaspec.models.synthetic import shape_config

    class NoMatmul(torch.nn.Module):
        def __init__(self, out_features: int, in_features: int) -> None:
            super().__init__()
            self.out_features = out_features
            self.weight = torch.empty(out_features, in_features, device="meta")  # its shape only (not a parameter)

        def forward(self, x):
            return x.new_zeros(*x.shape[:-1], self.out_features)

    class NoLookup(torch.nn.Module):
        def __init__(self, hidden: int) -> None:
            super().__init__()
            self.hidden = hidden

        def forward(self, ids):
            return torch.zeros(*ids.shape, self.hidden, dtype=dt, device=ids.device)

    dt = dtype
    config = shape_config(s)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dt)
    for name, module in list(model.named_modules()):
        if isinstance(module, torch.nn.Linear | torch.nn.Embedding):
            parent, _, child = name.rpartition(".")
            stub = (NoMatmul(module.out_features, module.in_features) if isinstance(module, torch.nn.Linear)
                    else NoLookup(s.hidden))
            setattr(model.get_submodule(parent) if parent else model, child, stub)
    model.to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():  # what is left: the RMSNorm weights (their initial value)
            p.fill_(1.0)
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    with torch.device(device):
        inner.rotary_emb = type(inner.rotary_emb)(config)  # its inverse frequencies, recomputed
    layer = inner.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    stubs = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj,
             model.lm_head]
    return model.eval(), stubs


def measure_overhead_curve(s: ModelShape, *, dtype: str = "float32", device: str = "cpu", widths=LINEAR_WIDTHS,
                           contexts=OVERHEAD_CONTEXTS, repeats: int = 5) -> tuple[tuple[int, int, float], ...]:
    """Time everything of a forward of shape ``s`` except its matrix products: the engine's verification forward
    (:func:`~adaspec.backends.costcurve.measure_verify_curve`: n tokens after L cached, logits of all n, argmax,
    cache cropped back) on the :class:`~adaspec.backends.torch_backend.TorchBackend` with every linear layer
    stood in for (:func:`_matmul_free_model`), less the stand-ins' own calls (the matrix curves include their
    dispatch). This is what a layer costs besides its weights on a CPU at the model's real widths: the KV cache's
    update (transformers' DynamicCache copies it each step), attention over it, norms, rotary, activations and the
    Python dispatch of about 30 operators; a 64-wide model (:func:`measure_dispatch_ms`) misses the first two.

    Returns:
        ``((n, L, ms per forward), ...)`` for each n of ``widths`` and L of ``contexts``, medians of ``repeats``.
    """
    import torch

    from adaspec.backends.torch_backend import TorchBackend, resolve_dtype
    from adaspec.backends.costcurve import measure_verify_curve

    dt = resolve_dtype(dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model, stubs = _matmul_free_model(s, dt, device)
    backend = TorchBackend(model, "overhead", max_context=max(contexts) + max(widths) + 1)
    own = {}
    with torch.inference_mode():
        for n in widths:
            xs = [torch.zeros(1, n, st.weight.shape[1], dtype=dt, device=device) for st in stubs]

            def calls(xs=xs):  # forward() only: the module call stays in, as a real linear layer's would
                for _ in range(s.layers):
                    for st, x in zip(stubs[:-1], xs):
                        st.forward(x)
                stubs[-1].forward(xs[-1])

            own[n] = _median_ms(calls, repeats, sync)
    out = []
    for L in contexts:
        curve = measure_verify_curve(backend, widths, context_len=L, repeats=repeats)
        out += [(int(n), int(L), max(ms - own[n], 0.0)) for n, ms in curve.items()]
    return tuple(sorted(out))


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


def measure_profile(*, dtype: str = "bfloat16", device: str = "cpu", threads: int | None = None,
                    hidden: int = 2560, repeats: int = 7, shapes=()) -> tuple[HardwareProfile, dict]:
    """Measure this machine's numbers with PyTorch: streaming read bandwidth (a reduction over a 256 MiB tensor)
    and the linear layer a model runs (``F.linear`` of ``[n, hidden]`` by ``[4 hidden, hidden]`` weights, larger
    than the caches, in ``dtype``) at n = 1, 2, 3, 5, 9, 17 tokens, kept as the profile's ``matmul_curve`` (ms per
    10^9 weights); ``matmul_tflops`` is the throughput at n = 17. Efficiencies are 1: the numbers are achieved ones.
    With ``shapes`` (:class:`~adaspec.models.synthetic.ModelShape` objects), each model's decoder layer is timed as a
    sequence (:func:`measure_layer_curve`), kept as ``layer_curves``, and its LM head alone
    (:func:`measure_linear_curve`), kept as ``linear_curves``: the models are then priced layer by layer plus the LM
    head. On a CPU each shape's forward without its matrix products is timed too (:func:`measure_overhead_curve`),
    kept as ``overhead_curves``.

    Returns:
        ``(profile, raw)``: the profile (``measured=True``, ``layer_ms`` from :func:`measure_dispatch_ms`) and
        the raw timings (ms, GB/s, TFLOP/s per width).
    """
    import torch

    from adaspec.backends.torch_backend import resolve_dtype

    if threads:
        torch.set_num_threads(threads)
    dt = resolve_dtype(dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    big = torch.ones(256 * 2**20 // 4, dtype=torch.float32, device=device)
    read_ms = _median_ms(lambda: big.sum(), repeats, sync)
    bandwidth = big.numel() * 4 / (read_ms / 1e3) / 1e9
    w = torch.randn(4 * hidden, hidden, dtype=dt, device=device)
    raw = {"read_ms": read_ms, "bandwidth_gbs": bandwidth, "matmul": {}}
    with torch.inference_mode():
        for n in (1, 2, 3, 5, 9, 17):
            x = torch.randn(n, hidden, dtype=dt, device=device)
            ms = _median_ms(lambda x=x: torch.nn.functional.linear(x, w), repeats, sync)
            raw["matmul"][n] = {"ms": ms, "tflops": 2 * n * w.numel() / (ms / 1e3) / 1e12,
                                "ms_per_gparam": ms / (w.numel() / 1e9)}
    # each model's layer is timed as a sequence below; alone, only the LM heads (priced with the layers' curves)
    dims = sorted({(sh.vocab, sh.hidden) for sh in shapes})
    linear_curves = tuple((d, measure_linear_curve(*d, dtype=dtype, device=device)) for d in dims)
    raw["linear"] = {f"{o}x{i}": dict(curve) for (o, i), curve in linear_curves}
    layers = sorted({sh.layer_matrices() for sh in shapes})
    layer_curves = tuple((m, measure_layer_curve(m, dtype=dtype, device=device)) for m in layers)
    raw["layer"] = {"/".join(f"{o}x{i}" for o, i in m): dict(curve) for m, curve in layer_curves}
    overhead_curves = tuple((sh, measure_overhead_curve(sh, dtype=dtype, device=device))
                            for sh in dict.fromkeys(shapes)) if device == "cpu" else ()
    names = {v: k for k, v in SHAPES.items()}
    raw["overhead"] = {names.get(sh, f"{sh.family}-{sh.hidden}x{sh.layers}"): curve for sh, curve in overhead_curves}
    layer_ms = measure_dispatch_ms(device=device, repeats=repeats)
    raw["layer_ms"] = layer_ms
    raw["linear_call_ms"] = linear_call_ms = measure_linear_call_ms(device=device) if dims else 0.0
    from adaspec.backends.cpu import cpu_label

    name = "this-cpu" if device == "cpu" else "this-gpu"
    label = cpu_label() if device == "cpu" else torch.cuda.get_device_name()
    memory = (torch.cuda.get_device_properties(0).total_memory if device == "cuda" else ram_bytes()) / 2**30
    prof = HardwareProfile(name, "cpu" if device == "cpu" else "gpu", bandwidth, raw["matmul"][17]["tflops"],
                           memory, bandwidth_efficiency=1.0, matmul_efficiency=1.0, layer_ms=layer_ms,
                           forward_ms=0.0, source=f"measured on {label} ({dtype}, {torch.get_num_threads()} threads)",
                           measured=True,
                           matmul_curve=tuple((n, v["ms_per_gparam"]) for n, v in raw["matmul"].items()),
                           linear_curves=linear_curves, linear_call_ms=linear_call_ms, layer_curves=layer_curves,
                           overhead_curves=overhead_curves)
    return prof, raw


def ram_bytes() -> int:
    """This machine's physical memory, bytes (0 where the OS does not say)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def measure_dispatch_ms(*, device: str = "cpu", layers: int = 16, repeats: int = 7) -> float:
    """Host time per decoder layer of an eager transformers Qwen2 forward, ms: a one-token forward of a model
    so narrow (hidden 64, vocabulary 256) that its arithmetic is negligible, divided by its layer count."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=4096)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ids = torch.tensor([[1]], device=device)
    with torch.inference_mode():
        ms = _median_ms(lambda: model(ids, use_cache=False), repeats, sync)
    return ms / layers


# Validation against published speedups ----------------------------------------------------------------------------
@dataclass(frozen=True)
class PublishedPoint:
    """One published speedup measurement to predict.

    Attributes:
        source: paper/leaderboard and table.
        hardware: a :data:`PROFILES` key.
        target, draft: :data:`SHAPES` keys (``draft`` None for a lookup drafter, prompt lookup decoding).
        method: what was measured (e.g. "SpS", "PLD").
        k: draft tokens per step (the method's setting).
        tau: published mean accepted tokens per step (τ, tokens emitted per target forward).
        speedup: published speedup over plain decoding.
        context: a typical context length of the benchmark, tokens.
        dtype: the weights' dtype (a :data:`BYTES_PER_PARAM` key).
        layer_ms: host time per decoder layer of the engine measured (0 for CUDA graphs, as vLLM captures them);
            None = the profile's (eager PyTorch).
    """

    source: str
    hardware: str
    target: str
    draft: str | None
    method: str
    k: int
    tau: float
    speedup: float
    context: int = 512
    dtype: str = "float16"
    layer_ms: float | None = None


SPEC_BENCH = ("Spec-Bench leaderboard (Xia et al. 2024, github.com/hemingkx/Spec-Bench Leaderboard.md): greedy, "
              "FP16, batch 1, PyTorch 2.0.1, HF transformers eager; SpS = HF assisted generation (5 draft tokens "
              "by default) with vicuna-68m; PLD = prompt lookup, 10 candidate tokens")
VLLM_H100 = ("T. Ruiz, \"Up to 3.55x faster: contributing speculative decoding with draft models to vLLM V1\" (blog, "
             "Jan 2026; logs in github.com/tomasruizt/vllm-scripts results/logs-2026-01-23, concurrency 1): vLLM V1 "
             "with CUDA graphs, one NVIDIA H100 96GB, Qwen3-32B bf16, temperature 0, 256 output tokens; speedup = "
             "plain mean TPOT / speculative mean TPOT, τ = its \"Acceptance length\"")
_VLLM_H100_ROWS = (  # dataset, plain mean TPOT (ms), draft, K, acceptance length τ, speculative mean TPOT (ms)
    ("MT-Bench", 34.17, "1.7B", 2, 2.35, 17.86), ("MT-Bench", 34.17, "1.7B", 4, 3.15, 15.24),
    ("MT-Bench", 34.17, "1.7B", 6, 3.58, 15.18), ("MT-Bench", 34.17, "4B", 2, 2.47, 19.28),
    ("MT-Bench", 34.17, "4B", 4, 3.42, 17.38), ("MT-Bench", 34.17, "4B", 6, 4.05, 17.65),
    ("InstructCoder", 33.97, "1.7B", 2, 2.24, 18.73), ("InstructCoder", 33.97, "1.7B", 4, 2.85, 16.98),
    ("InstructCoder", 33.97, "1.7B", 6, 3.17, 17.18), ("InstructCoder", 33.97, "4B", 2, 2.35, 20.29),
    ("InstructCoder", 33.97, "4B", 4, 3.16, 18.72), ("InstructCoder", 33.97, "4B", 6, 3.60, 19.88),
)
PUBLISHED: tuple[PublishedPoint, ...] = (
    PublishedPoint(SPEC_BENCH + ", RTX 3090 table", "rtx-3090", "vicuna-7b", "vicuna-68m", "SpS", 5, 2.29, 1.83),
    PublishedPoint(SPEC_BENCH + ", RTX 3090 table", "rtx-3090", "vicuna-7b", None, "PLD", 10, 1.74, 1.55),
    PublishedPoint(SPEC_BENCH + ", A100 table", "a100-80gb", "vicuna-7b", "vicuna-68m", "SpS", 5, 2.28, 1.49),
    PublishedPoint(SPEC_BENCH + ", A100 table", "a100-80gb", "vicuna-7b", None, "PLD", 10, 1.73, 1.59),
    PublishedPoint(SPEC_BENCH + ", A100 table", "a100-80gb", "vicuna-13b", "vicuna-68m", "SpS", 5, 2.18, 1.49),
    PublishedPoint(SPEC_BENCH + ", A100 table", "a100-80gb", "vicuna-13b", None, "PLD", 10, 1.68, 1.48),
    PublishedPoint(SPEC_BENCH + ", A100 table", "a100-80gb", "vicuna-33b", "vicuna-68m", "SpS", 5, 2.01, 1.61),
    PublishedPoint(SPEC_BENCH + ", A100 table", "a100-80gb", "vicuna-33b", None, "PLD", 10, 1.55, 1.42),
    *(PublishedPoint(VLLM_H100, "h100-sxm", "qwen3-32b", f"qwen3-{draft.lower()}",
                     f"{data}, draft {draft}", k, tau, plain_tpot / tpot, context=256, dtype="bfloat16", layer_ms=0.0)
      for data, plain_tpot, draft, k, tau, tpot in _VLLM_H100_ROWS),
)
"""Published speedups with their τ, so a prediction needs no α: speedup = τ T(1) / (K T_d + T(K + 1))."""


def predict_published(p: PublishedPoint, prof: HardwareProfile | None = None, *, lookup_ms: float = 0.1) -> float:
    """Predicted speedup of a published point on its hardware profile (or ``prof``): the published τ over the
    predicted step-time ratio, speedup = τ T(1, L) / (K T_d(L) + T(K + 1, L))."""
    prof = prof or profile(p.hardware, layer_ms=p.layer_ms)
    t = SHAPES[p.target]
    plain = prof.forward_time_ms(t, 1, p.context, dtype=p.dtype)
    draft = lookup_ms if p.draft is None else prof.forward_time_ms(SHAPES[p.draft], 1, p.context, dtype=p.dtype)
    step = p.k * draft + prof.forward_time_ms(t, p.k + 1, p.context, dtype=p.dtype)
    return p.tau * plain / step


def validate_published(points=PUBLISHED, **overrides) -> list[dict]:
    """Each published point with its prediction and relative error (``overrides`` go to every profile)."""
    out = []
    for p in points:
        given = {k: v for k, v in overrides.items() if v is not None}  # an unset override keeps the point's own
        pred = predict_published(p, profile(p.hardware, **{"layer_ms": p.layer_ms, **given}))
        out.append({**asdict(p), "predicted": pred, "error": (pred - p.speedup) / p.speedup})
    return out


def median_abs_error(rows: list[dict]) -> float:
    errs = [abs(r["error"]) for r in rows if not math.isnan(r["error"])]
    return statistics.median(errs) if errs else math.nan

