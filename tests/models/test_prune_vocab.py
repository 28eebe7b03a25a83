"""A draft with its vocabulary cut (adaspec.models.prune_vocab, FR-Spec): the file it writes, the mapping the GGUF
backends apply, and speculation with it staying lossless. On the zoo's smollm2-135m-instruct (49,152 tokens), cut to
its first 2,048 ids plus its special tokens."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from adaspec.errors import ConfigError
from adaspec.models.prune_vocab import _stand_ins, prune_vocab, read_vocab_map

pytestmark = pytest.mark.slow

HAVE_LLAMACPP = importlib.util.find_spec("llama_cpp") is not None
HAVE_IK = importlib.util.find_spec("ik_llama_cpp") is not None
RUNTIMES = [pytest.param("ik", marks=pytest.mark.skipif(not HAVE_IK, reason="ik-llama-cpp-python not installed")),
            pytest.param("llamacpp", marks=pytest.mark.skipif(not HAVE_LLAMACPP,
                                                              reason="llama-cpp-python not installed"))]
KEEP = 2048


def test_a_token_outside_the_kept_set_stands_in_as_its_longest_kept_prefix():
    tokens = ["a", "b", "ab", "abc", "abd", "ba", "bab", "c"]
    kept = [0, 1, 2, 7]  # a, b, ab, c
    got = _stand_ins(tokens, kept)
    # new ids: a 0, b 1, ab 2, c 3; abc -> ab, abd -> ab, ba -> b, bab -> b
    assert got.tolist() == [0, 1, 2, 2, 2, 1, 1, 3]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from adaspec.models import fetch_gguf

    full = fetch_gguf("smollm2-135m-instruct", progress=False)
    cut = tmp_path_factory.mktemp("vocab") / "smollm2-v2048.gguf"
    vmap = prune_vocab(full, cut, KEEP)
    return full, cut, vmap


def test_the_pruned_file_records_its_map(files):
    full, cut, vmap = files
    import gguf

    reader = gguf.GGUFReader(str(full))
    types = reader.get_field("tokenizer.ggml.token_type").contents()
    specials = [i for i in range(KEEP, len(types)) if types[i] in (3, 4)]
    assert vmap.original_size == len(types) == 49152
    assert vmap.kept.tolist() == list(range(KEEP)) + specials
    assert read_vocab_map(cut).kept.tolist() == vmap.kept.tolist()
    assert np.array_equal(read_vocab_map(cut).stand_in, vmap.stand_in)
    assert read_vocab_map(full) is None
    assert cut.stat().st_size < full.stat().st_size
    with pytest.raises(ValueError, match="keep must be in"):
        prune_vocab(full, cut.with_name("bad.gguf"), 100)
    with pytest.raises(ValueError, match="keep must be in"):
        prune_vocab(full, cut.with_name("bad.gguf"), 49152)


def test_extra_and_named_tokens_are_kept_and_a_failed_cut_leaves_no_file(files, tmp_path):
    full, cut, vmap = files
    import gguf

    reader = gguf.GGUFReader(str(full))
    named = {int(f.contents()) for f in reader.fields.values()
             if f.name.startswith("tokenizer.ggml.") and f.name.endswith("_token_id")}
    assert named <= set(vmap.kept.tolist())
    dst = tmp_path / "extra.gguf"
    got = prune_vocab(full, dst, KEEP, extra=[40000, 12])
    assert 40000 in got.kept.tolist() and got.kept[got.stand_in[40000]] == 40000
    assert len(got.kept) == len(vmap.kept) + 1
    with pytest.raises(ValueError, match="out of range"):
        prune_vocab(full, tmp_path / "bad.gguf", KEEP, extra=[49152])
    assert not list(tmp_path.glob("*bad.gguf*"))


def test_chat_template_ids_hold_the_role_markers():
    from adaspec.models.prune_vocab import chat_template_ids
    from adaspec.api import load_model

    tok = load_model("smollm2-135m-instruct@ik", progress=False, threads=2).tokenizer
    ids = chat_template_ids(tok)
    assert set(tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]) <= ids
    assert chat_template_ids(object()) == set()


def _backend(runtime: str, path, **kw):
    if runtime == "ik":
        from adaspec.backends.ik_backend import IkLlamaBackend

        return IkLlamaBackend(path, threads=2, max_context=512, **kw)
    from adaspec.backends.llamacpp_backend import LlamaCppBackend

    return LlamaCppBackend(path, threads=2, max_context=512, **kw)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_backend_takes_original_ids_and_returns_logits_over_the_whole_vocabulary(files, runtime):
    full_path, cut_path, vmap = files
    full, cut = _backend(runtime, full_path), _backend(runtime, cut_path)
    assert cut.vocab_size == full.vocab_size == 49152 and full.vocab_map is None
    ids = [1, 504, 1030, 314, 260, 1712, 42, 7, 1987, 33]  # all kept: the same context reaches both models
    a, b = full.forward(ids, num_logits=len(ids)), cut.forward(ids, num_logits=len(ids))
    kept = torch.from_numpy(vmap.kept)
    assert b.shape == a.shape
    assert (a[:, kept] - b[:, kept]).abs().max().item() < 1e-3
    outside = torch.ones(a.shape[1], dtype=torch.bool)
    outside[kept] = False
    assert torch.isneginf(b[:, outside]).all()
    # the draft's argmax is the full model's argmax over the kept tokens
    assert b.argmax(-1).tolist() == kept[a[:, kept].argmax(-1)].tolist()
    # a rare token reaches the model as its stand-in; the cache holds the original id
    rare = 40000
    assert vmap.stand_in[rare] < len(vmap.kept)
    before = cut.seq_len
    got = cut.forward([rare])
    assert cut.seq_len == before + 1 and torch.isfinite(got[0, kept]).all()
    with pytest.raises(RuntimeError, match="out of range"):
        cut.forward([49152])
    assert cut.seq_len == before + 1  # the failed call left the cache as it was
    full.close()
    cut.close()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_kept_ids_past_the_first_run_get_their_own_logits(files, tmp_path, runtime):
    """Ids kept beyond the first ``keep`` (``extra``) are scattered to their own columns, not shifted into the run."""
    full_path, _, _ = files
    dst = tmp_path / "tail.gguf"
    vmap = prune_vocab(full_path, dst, KEEP, extra=[40000, 30000])
    full, cut = _backend(runtime, full_path), _backend(runtime, dst)
    ids = [1, 504, 1030, 314, 260]
    a, b = full.forward(ids, num_logits=2), cut.forward(ids, num_logits=2)
    kept = torch.from_numpy(vmap.kept)
    assert kept[-2:].tolist() == [30000, 40000] and cut._kept_run == KEEP
    assert (a[:, kept] - b[:, kept]).abs().max().item() < 1e-3
    assert torch.isneginf(b[:, KEEP:30000]).all() and torch.isfinite(b[:, [30000, 40000]]).all()
    full.close()
    cut.close()


def test_a_load_refuses_a_map_that_does_not_fit(files, tmp_path):
    """A file whose recorded map names another vocabulary size than its tokens: a clear error at load."""
    full_path, cut_path, vmap = files
    import gguf

    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(str(cut_path))
    bad = tmp_path / "bad.gguf"
    short = MetadataDetails(gguf.GGUFValueType.ARRAY, vmap.kept.tolist()[:-1], sub_type=gguf.GGUFValueType.INT32)
    copy_with_new_metadata(reader, gguf.GGUFWriter(str(bad), reader.get_field("general.architecture").contents()),
                           {"adaspec.vocab.kept": short}, [])
    runtime = "ik" if HAVE_IK else "llamacpp"
    with pytest.raises(ConfigError, match="vocabulary map"):
        _backend(runtime, bad)


@pytest.mark.skipif(not HAVE_IK, reason="ik-llama-cpp-python not installed")
def test_speculation_with_the_pruned_draft_is_lossless_in_strict_mode(files):
    from adaspec.api import load_model
    from adaspec.controllers import make_controller
    from adaspec.drafters import ModelDrafter
    from adaspec.engine import GenerationConfig, SpeculativeEngine

    full_path, cut_path, vmap = files
    target = load_model("smollm2-135m-instruct@ik", progress=False, threads=2)
    draft = _backend("ik", cut_path)
    cfg = GenerationConfig(max_new_tokens=40, strict=True)
    plain = SpeculativeEngine(target.backend, None, None, tokenizer=target.tokenizer)
    spec = SpeculativeEngine(target.backend, ModelDrafter(draft), make_controller("fixed", 4),
                             tokenizer=target.tokenizer)
    drafted = accepted = 0
    for text in ["Write a Python function that returns the factorial of n.",
                 "List three prime numbers and explain why they are prime."]:
        ids = target.tokenizer(text)["input_ids"]
        want = plain.generate(ids, cfg)
        got = spec.generate(ids, cfg)
        assert got.token_ids == want.token_ids, text
        drafted += got.stats.draft_tokens
        accepted += got.stats.accepted_tokens
    assert drafted > 0 and accepted > 0


def test_a_cut_that_leaves_no_merge_is_refused_and_writes_nothing(tmp_path):
    # a synthetic BPE vocabulary: 256 byte-like tokens, then 44 merged ones; every merge's result lies past the cut
    import gguf

    tokens = [chr(0x100 + i) for i in range(256)] + [chr(0x100 + i) + chr(0x100 + i + 1) for i in range(44)]
    merges = [f"{chr(0x100 + i)} {chr(0x100 + i + 1)}" for i in range(44)]
    src = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(src), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_token_merges(merges)
    writer.add_tensor("token_embd.weight", np.arange(len(tokens) * 4, dtype=np.float32).reshape(len(tokens), 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    with pytest.raises(ValueError, match="no merge .* survives a cut to 256 ids"):
        prune_vocab(src, tmp_path / "cut.gguf", 256)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]
    got = prune_vocab(src, tmp_path / "cut.gguf", 257)  # the first merge, whose result is id 256, survives
    assert got.kept.tolist() == list(range(257))
    reader = gguf.GGUFReader(str(tmp_path / "cut.gguf"))
    assert list(reader.get_field("tokenizer.ggml.merges").contents()) == merges[:1]
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert np.array_equal(np.asarray(emb.data).reshape(257, 4)[256], np.arange(256 * 4, 257 * 4, dtype=np.float32))
