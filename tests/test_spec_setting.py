"""adaspec.spec_setting: the one speculation-setting type and its parser (method strings and fields)."""

from __future__ import annotations

import pytest

from adaspec.errors import ConfigError
from adaspec.spec_setting import (PLAIN, SpecSetting, builtin_drafter, expand_drafter, layerskip_layers,
                                  parse_method, reference_method, validate)


@pytest.mark.parametrize("text, expected", [
    ("plain", SpecSetting(None, "fixed", 0, label="plain")),
    ("fixed:3", SpecSetting("d", "fixed", 3, label="fixed:3")),
    ("goodput", SpecSetting("d", "goodput", None, label="goodput")),
    ("ngram/adaptive:2", SpecSetting("ngram", "adaptive", 2, label="ngram/adaptive:2")),
    ("hybrid/goodput", SpecSetting("ngram+d", "goodput", None, label="hybrid/goodput")),
    ("hybrid-suffix/fixed:4", SpecSetting("suffix+ngram+d", "fixed", 4, label="hybrid-suffix/fixed:4")),
    ("plain+strict", SpecSetting(None, "fixed", 0, strict=True, label="plain+strict")),
    ("hybrid/goodput+topk:2", SpecSetting("ngram+d", "goodput", None, lossy="topk:2",
                                          label="hybrid/goodput+topk:2")),
    ("ngram-tree/fixed:4+tree:12:always:expand=0+strict",
     SpecSetting("ngram-tree", "fixed", 4, strict=True, tree_budget=12, tree_choice="always", tree_expand=0,
                 label="ngram-tree/fixed:4+tree:12:always:expand=0+strict")),
])
def test_parse_method(text, expected):
    assert parse_method(text, "d") == expected


@pytest.mark.parametrize("text, message", [
    ("magic:2", "controller must be one of"), ("fixed", "use fixed:K"), ("fixed:x", "K must be an integer"),
    ("goodput+fast", "neither 'strict' nor a lossy rule"),
    ("goodput+topk:2+bild", "one lossy rule at most"), ("plain+typical", "needs a drafter"),
    ("plain+tree:4", "needs a drafter"), ("fixed:4+tree:0", "tree:0 is a chain"),
    ("fixed:4+tree:8:sometimes", "unknown choice"), ("fixed:4+tree:8:expand=-1", "expand must be >= 0"),
])
def test_parse_method_errors_name_the_method(text, message):
    with pytest.raises(ConfigError, match=message) as e:
        parse_method(text, "d")
    assert str(e.value).startswith(f"bad method {text!r}")
    with pytest.raises(ConfigError, match="draft length K must be >= 0, got -1"):  # the controller's own message
        parse_method("fixed:-1", "d")


def test_reference_and_server_view():
    assert parse_method("hybrid/goodput+strict", "d").reference == "plain+strict"
    assert parse_method("hybrid/goodput", "d").reference == "plain"
    assert reference_method("a/b+c/goodput+strict") == "plain+strict"
    assert PLAIN.plain and PLAIN.as_dict() == {"drafter": "none", "controller": "fixed", "k": 0}
    assert SpecSetting("ngram", "goodput", 3).as_dict() == {"drafter": "ngram", "controller": "goodput", "k": 3}


def test_validate_fields():
    assert validate("none", "fixed", 0) == PLAIN
    assert validate("NONE", "goodput", None).drafter is None
    assert validate("layerskip:4", "adaptive", 2, tree_budget=8) == SpecSetting("layerskip:4", "adaptive", 2,
                                                                               tree_budget=8)
    for args, kwargs, message in [
        (("ngram", "magic", None), {}, "unknown controller 'magic'; choose one of adaptive, fixed"),
        (("ngram", "fixed", -1), {}, "K must be >= 0, got -1"),
        (("layerskip:x", "fixed", 2), {}, "expected layerskip:N with an integer N, got 'layerskip:x'"),
        (("ngram", "fixed", 2), {"lossy": "nope"}, "unknown lossy acceptance rule 'nope'"),
        (("ngram", "fixed", 2), {"tree_budget": -1}, "tree_budget must be in"),
        ((None, "fixed", 0), {"lossy": "typical"}, "needs a drafter"),
    ]:
        with pytest.raises(ConfigError, match=message):
            validate(*args, **kwargs)


def test_drafter_helpers():
    assert expand_drafter("Hybrid", "m") == "ngram+m" and expand_drafter("hybrid-suffix", "m") == "suffix+ngram+m"
    assert expand_drafter("ngram", "m") == "ngram"
    assert layerskip_layers("layerskip:12") == 12 and layerskip_layers("ngram") is None
    assert [builtin_drafter(s) for s in ("none", "ngram", "ngram-tree", "suffix:factor=2", "layerskip:3",
                                         "hybrid", "a+b", "qwen")] == [True] * 5 + [False] * 3


def test_none_drafter_is_plain_and_a_label_first_call_is_refused():
    """``"none"`` (plain decoding's drafter as the server reports it) is stored as None, so it equals PLAIN; the
    older ``compare.Method(label, drafter, controller, k)`` order, called positionally, fails instead of shifting
    every field silently."""
    from adaspec.errors import ConfigError
    from adaspec.spec_setting import PLAIN, SpecSetting

    assert SpecSetting("none", "fixed", 0) == PLAIN and SpecSetting("None", "fixed", 0).plain
    assert SpecSetting("ngram", "fixed", 4).drafter == "ngram"
    with pytest.raises(ConfigError, match="k must be an int or None, not 'fixed'"):
        SpecSetting("ngram/fixed:4", "ngram", "fixed", 4)
