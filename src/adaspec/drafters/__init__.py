"""Drafters: one module each (draft model, n-gram prompt lookup, suffix decoding, several with a per-step choice)."""

from adaspec.drafters.base import Draft, Drafter, DraftStop
from adaspec.drafters.model import ModelDrafter
from adaspec.drafters.multi import MultiDrafter
from adaspec.drafters.ngram import NgramDrafter, NgramTreeDrafter
from adaspec.drafters.suffix import SuffixDrafter

__all__ = ["Draft", "Drafter", "DraftStop", "ModelDrafter", "MultiDrafter", "NgramDrafter", "NgramTreeDrafter",
           "SuffixDrafter"]
