"""adaspec: adaptive, lossless speculative decoding, and tools to measure where it pays."""

from adaspec.engine import GenerationConfig, GenerationResult, SpeculativeEngine, StreamChunk
from adaspec.errors import AdaspecError
from adaspec.stats import GenerationStats, StepRecord

__version__ = "0.1.0"

__all__ = ["AdaspecError", "GenerationConfig", "GenerationResult", "GenerationStats", "SpeculativeEngine",
           "StepRecord", "StreamChunk", "__version__"]
