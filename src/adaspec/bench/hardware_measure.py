"""Measuring the machine at hand for a :class:`~adaspec.bench.hardware.HardwareProfile`: streaming bandwidth,
matrix-product curves at decoding widths, a forward's work besides its matrix products, and eager PyTorch's host time
per decoder layer, timed with PyTorch."""

from __future__ import annotations

import math
import statistics
import time

from adaspec.bench.hardware import HardwareProfile
from adaspec.errors import ConfigError
from adaspec.models.synthetic import SHAPES, ModelShape


def _median_ms(fn, repeats: int, sync) -> float:
    """Median wall time of ``fn()`` in ms over ``repeats`` runs after one warm-up, each ended by ``sync()``."""
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

    from adaspec.backends.torch_models import resolve_dtype

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

    from adaspec.backends.torch_backend import TorchBackend
    from adaspec.backends.torch_models import resolve_dtype
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

    from adaspec.backends.torch_models import resolve_dtype

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
