"""Captioners: the caption vocabulary, NIC and transformer forward passes, style conditioning, greedy decoding,
the teacher-forcing loss and saving/loading, on tiny real torch models."""
from __future__ import annotations

import math

import pytest
import torch

from models.captioners import (CaptionVocab, NICCaptioner, TransformerCaptioner, beam_decode, build_captioner,
                               greedy_decode, load_captioner, save_captioner, style_token, teacher_forcing_loss)

torch.set_num_threads(1)

CAPTIONS = ["A dog runs on the grass.", "a dog sleeps", "a cat sleeps on the sofa", "two kids play"]
STYLES = ["humor", "romantic"]
TINY = {"nic": {"embed_dim": 16, "hidden_dim": 24}, "transformer": {"d_model": 16, "nhead": 2, "num_layers": 1,
                                                                     "dim_feedforward": 32, "max_len": 24}}


@pytest.fixture()
def vocab() -> CaptionVocab:
    return CaptionVocab.build(CAPTIONS, STYLES, min_count=1)


def tiny(kind: str, vocab: CaptionVocab, feature_dim: int = 8) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_captioner(kind, feature_dim, vocab, dropout=0.0, **TINY[kind])


def test_vocab_ids_counts_and_min_count(vocab: CaptionVocab) -> None:
    assert vocab.itos[:4] == ("<pad>", "<bos>", "<eos>", "<unk>")
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2, 3)
    assert vocab.itos[4:6] == (style_token("humor"), style_token("romantic")) == ("<style:humor>", "<style:romantic>")
    # "a" x3, then "dog", "on", "sleeps", "the" x2 (alphabetical among ties), then the single words
    assert vocab.words[:5] == ("a", "dog", "on", "sleeps", "the")
    assert len(vocab) == 4 + 2 + 12
    frequent = CaptionVocab.build(CAPTIONS, STYLES, min_count=2)
    assert frequent.words == ("a", "dog", "on", "sleeps", "the")


def test_vocab_encode_decode_round_trip(vocab: CaptionVocab) -> None:
    ids = vocab.encode("A cat sleeps on the SOFA.", "romantic")
    assert ids[0] == vocab.style_id("romantic") and ids[1] == vocab.bos_id and ids[-1] == vocab.eos_id
    assert len(ids) == 2 + 6 + 1
    assert vocab.decode(ids) == "a cat sleeps on the sofa"
    assert vocab.encode("a zebra", "humor")[3] == vocab.unk_id
    assert vocab.decode(vocab.encode("one three four five", "humor", max_words=2)) == "<unk> <unk>"
    batch = vocab.encode_batch(["a dog", "a cat sleeps on the sofa"], ["humor", "romantic"])
    assert batch.shape == (2, 9) and batch.dtype == torch.long
    assert batch[0, 5:].tolist() == [vocab.pad_id] * 4
    assert CaptionVocab.from_dict(vocab.to_dict()).itos == vocab.itos


def test_vocab_rejects_bad_input(vocab: CaptionVocab) -> None:
    with pytest.raises(ValueError, match="unknown style 'sad'.*humor"):
        vocab.encode("a dog", "sad")
    with pytest.raises(ValueError, match="min_count"):
        CaptionVocab.build(CAPTIONS, STYLES, min_count=0)
    with pytest.raises(ValueError, match="style name"):
        CaptionVocab.build(CAPTIONS, ["very funny"])
    with pytest.raises(ValueError, match="at least one style"):
        CaptionVocab.build(CAPTIONS, [])
    with pytest.raises(ValueError, match="differ in length"):
        vocab.encode_batch(["a dog"], ["humor", "romantic"])


@pytest.mark.parametrize("kind", ["nic", "transformer"])
def test_forward_shapes_for_vectors_and_regions(kind: str, vocab: CaptionVocab) -> None:
    model = tiny(kind, vocab)
    tokens = vocab.encode_batch(CAPTIONS[:3], ["humor", "romantic", "humor"])
    assert model(torch.randn(3, 8), tokens).shape == (3, tokens.shape[1], len(vocab))
    assert model(torch.randn(3, 5, 8), tokens).shape == (3, tokens.shape[1], len(vocab))
    with pytest.raises(ValueError, match=r"features must be \[batch, 8\]"):
        model(torch.randn(3, 7), tokens)


@pytest.mark.parametrize("kind", ["nic", "transformer"])
def test_padded_regions_are_ignored(kind: str, vocab: CaptionVocab) -> None:
    model = tiny(kind, vocab).eval()
    tokens = vocab.encode_batch(["a dog sleeps"], ["humor"])
    regions = torch.randn(1, 3, 8)
    padded = torch.cat([regions, 100 * torch.randn(1, 2, 8)], dim=1)
    mask = torch.tensor([[False, False, False, True, True]])
    torch.testing.assert_close(model(padded, tokens, mask), model(regions, tokens), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["nic", "transformer"])
def test_style_token_changes_the_prediction_and_decoding_is_causal(kind: str, vocab: CaptionVocab) -> None:
    model = tiny(kind, vocab).eval()
    features = torch.randn(1, 8)
    humor = vocab.encode_batch(["a dog sleeps"], ["humor"])
    romantic = vocab.encode_batch(["a dog sleeps"], ["romantic"])
    assert (humor[:, 1:] == romantic[:, 1:]).all() and humor[0, 0] != romantic[0, 0]
    delta = (model(features, humor) - model(features, romantic)).abs()
    assert delta[0, 1:].amax(dim=-1).min() > 1e-4  # every word position sees the style token
    later = humor.clone()
    later[0, -1] = vocab.stoi["cat"]
    torch.testing.assert_close(model(features, later)[:, :-1], model(features, humor)[:, :-1])


def test_teacher_forcing_loss_matches_cross_entropy(vocab: CaptionVocab) -> None:
    model = tiny("transformer", vocab).eval()
    features, tokens = torch.randn(2, 8), vocab.encode_batch(["a dog", "a cat sleeps"], ["humor", "romantic"])
    loss = teacher_forcing_loss(model, features, tokens, vocab.pad_id)
    logits = model(features, tokens[:, :-1])
    log_probs = torch.log_softmax(logits, dim=-1)
    # targets: "a dog <eos>" and "a cat sleeps <eos>" at positions 1.. (position 0 would predict <bos>)
    picked = [log_probs[0, t, tokens[0, t + 1]] for t in range(1, 4)]
    picked += [log_probs[1, t, tokens[1, t + 1]] for t in range(1, 5)]
    assert loss.item() == pytest.approx(-torch.stack(picked).mean().item(), rel=1e-5)
    assert abs(loss.item() - math.log(len(vocab))) < 1.5  # an untrained model is near uniform


@pytest.mark.parametrize("kind", ["nic", "transformer"])
def test_greedy_decode_batch_and_modes(kind: str, vocab: CaptionVocab) -> None:
    model = tiny(kind, vocab).train()
    captions = greedy_decode(model, torch.randn(3, 8), ["humor", "romantic", "humor"], max_len=6,
                             no_repeat_ngram_size=0)
    assert len(captions) == 3 and model.training
    for caption in captions:
        words = caption.split()
        assert len(words) <= 6
        assert all(w in vocab.words or w == "<unk>" for w in words)
    with pytest.raises(ValueError, match="2 styles for 3 images"):
        greedy_decode(model, torch.randn(3, 8), ["humor", "romantic"], no_repeat_ngram_size=0, max_len=20)
    with pytest.raises(ValueError, match="unknown style"):
        greedy_decode(model, torch.randn(1, 8), "sad", no_repeat_ngram_size=0, max_len=20)


def fitted(kind: str, vocab: CaptionVocab) -> tuple[torch.nn.Module, torch.Tensor]:
    """A tiny captioner fitted to write CAPTIONS[i] (humor) for image i, so beams end in real words."""
    model = tiny(kind, vocab)
    features = torch.eye(4, 8)
    tokens = vocab.encode_batch(CAPTIONS, ["humor"] * 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(300):
        optimizer.zero_grad()
        teacher_forcing_loss(model, features, tokens, vocab.pad_id).backward()
        optimizer.step()
    return model.eval(), features


@pytest.mark.parametrize("kind", ["nic", "transformer"])
def test_beam_decode_scores_are_the_model_log_probabilities(kind: str, vocab: CaptionVocab) -> None:
    model, features = fitted(kind, vocab)
    beams = beam_decode(model, features, "humor", beam_size=3, max_len=10, length_penalty=0.0, no_repeat_ngram_size=0)
    assert [b[0][0] for b in beams] == [" ".join(c.lower().rstrip(".").split()) for c in CAPTIONS]
    assert [b[0][0] for b in beams] == greedy_decode(model, features, "humor", max_len=10, no_repeat_ngram_size=0)
    for i, candidates in enumerate(beams):
        assert 1 < len(candidates) <= 3 and len({c for c, _ in candidates}) == len(candidates)
        scores = [s for _, s in candidates]
        assert scores == sorted(scores, reverse=True) and all(s <= 0 for s in scores)
        for caption, score in candidates:  # the sum of log p(token) up to and including <eos>
            tokens = vocab.encode_batch([caption], ["humor"])
            with torch.no_grad():
                logp = torch.log_softmax(model(features[i:i + 1], tokens[:, :-1]), dim=-1)[0]
            summed = sum(logp[t, tokens[0, t + 1]].item() for t in range(1, tokens.shape[1] - 1))
            assert score == pytest.approx(summed, abs=1e-3)  # float32 sums
    normalised = beam_decode(model, features[:1], "humor", beam_size=3, max_len=10, length_penalty=1.0,
                             no_repeat_ngram_size=0)[0]
    assert normalised[0][1] == pytest.approx(beams[0][0][1] / (len(beams[0][0][0].split()) + 1), abs=1e-3)


@pytest.mark.parametrize("kind", ["nic", "transformer"])
def test_beam_of_one_is_greedy_and_bad_arguments_fail(kind: str, vocab: CaptionVocab) -> None:
    model = tiny(kind, vocab).train()
    features = torch.randn(3, 8)
    greedy = greedy_decode(model, features, ["humor", "romantic", "humor"], max_len=6, no_repeat_ngram_size=0)
    beams = beam_decode(model, features, ["humor", "romantic", "humor"], beam_size=1, max_len=6, no_repeat_ngram_size=0)
    assert [b[0][0] for b in beams] == greedy and model.training
    with pytest.raises(ValueError, match="beam_size must be an integer >= 1"):
        beam_decode(model, features, "humor", beam_size=0, no_repeat_ngram_size=0, max_len=20)
    with pytest.raises(ValueError, match="2 styles for 3 images"):
        beam_decode(model, features, ["humor", "romantic"], no_repeat_ngram_size=0, max_len=20)


@pytest.mark.parametrize("kind", ["nic", "transformer"])
def test_decoding_never_writes_unk(kind: str, vocab: CaptionVocab) -> None:
    model = tiny(kind, vocab)
    with torch.no_grad():
        model.out.bias[vocab.unk_id] = 50.0  # <unk> is every step's most likely token
        assert model(torch.randn(1, 8), vocab.encode_batch(["a"], ["humor"])[:, :2])[0, -1].argmax() == vocab.unk_id
    features = torch.randn(3, 8)
    greedy = greedy_decode(model, features, "humor", max_len=6, no_repeat_ngram_size=0)
    beams = beam_decode(model, features, "humor", beam_size=3, max_len=6, no_repeat_ngram_size=0)
    written = greedy + [caption for candidates in beams for caption, _ in candidates]
    assert len(written) > 3 and all("<unk>" not in c.split() for c in written)


def test_transformer_decode_length_limit(vocab: CaptionVocab) -> None:
    model = tiny("transformer", vocab)
    with pytest.raises(ValueError, match="max_len 30 needs 31 positions"):
        greedy_decode(model, torch.randn(1, 8), "humor", max_len=30, no_repeat_ngram_size=0)


def test_build_captioner_rejects_bad_arguments(vocab: CaptionVocab) -> None:
    with pytest.raises(ValueError, match=r"kind must be one of \['nic', 'transformer', 'updown'\]"):
        build_captioner("sat", 8, vocab)
    with pytest.raises(ValueError, match="unknown hyper-parameters.*hidden_size"):
        build_captioner("nic", 8, vocab, hidden_size=8)
    with pytest.raises(ValueError, match="divisible by nhead"):
        build_captioner("transformer", 8, vocab, d_model=10, nhead=4)
    with pytest.raises(ValueError, match="feature_dim"):
        build_captioner("nic", 0, vocab)
    with pytest.raises(ValueError, match="dropout"):
        build_captioner("nic", 8, vocab, dropout=1.5)
    assert isinstance(build_captioner("nic", 8, vocab), NICCaptioner)
    assert isinstance(build_captioner("transformer", 8, vocab), TransformerCaptioner)


@pytest.mark.parametrize("kind", ["nic", "transformer"])
def test_save_and_load_give_the_same_model(kind: str, vocab: CaptionVocab, tmp_path) -> None:
    model = tiny(kind, vocab).eval()
    save_captioner(model, tmp_path / "cap")
    loaded = load_captioner(tmp_path / "cap")
    assert loaded.kind == kind and loaded.vocab.itos == vocab.itos and loaded.hparams == model.hparams
    features, tokens = torch.randn(2, 8), vocab.encode_batch(CAPTIONS[:2], STYLES)
    torch.testing.assert_close(loaded(features, tokens), model(features, tokens))
    with pytest.raises(ValueError, match="not a saved captioner"):
        load_captioner(tmp_path)


def test_nic_feeds_the_image_at_the_scale_of_a_word(vocab: CaptionVocab) -> None:
    # eight unit-norm 384-d sentence vectors per image (the visual context): pooled and projected, they enter the
    # LSTM; normalised, their entries are ~1 like a word embedding's, where unnormalised they were ~20x smaller
    torch.manual_seed(0)
    regions = torch.nn.functional.normalize(torch.randn(16, 8, 384), dim=-1)
    normed = build_captioner("nic", 384, vocab, dropout=0.0)
    plain = build_captioner("nic", 384, vocab, dropout=0.0, image_norm=0)
    with torch.no_grad():
        word = normed.embed.weight.std().item()
        scaled = normed.image_norm(normed.image_proj(regions.mean(dim=1))).std().item()
        unscaled = plain.image_norm(plain.image_proj(regions.mean(dim=1))).std().item()
    assert 0.5 * word < scaled < 2 * word
    assert unscaled < 0.05 * word
    assert normed.hparams["image_norm"] == 1 and plain.hparams["image_norm"] == 0
    with pytest.raises(ValueError, match="image_norm must be 0 or 1"):
        build_captioner("nic", 384, vocab, image_norm=2)


def test_nic_saved_before_image_norm_loads_as_it_was(vocab: CaptionVocab, tmp_path) -> None:
    import json

    model = tiny("nic", vocab)
    old = build_captioner("nic", 8, vocab, dropout=0.0, image_norm=0, **TINY["nic"])
    old.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("image_norm.")})
    save_captioner(old.eval(), tmp_path)
    config = json.loads((tmp_path / "captioner.json").read_text())
    del config["hparams"]["image_norm"]  # a captioner.json written before the parameter existed
    (tmp_path / "captioner.json").write_text(json.dumps(config))
    loaded = load_captioner(tmp_path)
    assert loaded.hparams["image_norm"] == 0
    features = torch.randn(3, 8)
    plain = dict(max_len=6, no_repeat_ngram_size=0)
    assert greedy_decode(loaded, features, "humor", **plain) == greedy_decode(old, features, "humor", **plain)


def _ngrams(caption: str, n: int) -> list[tuple[str, ...]]:
    words = caption.split()
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


@pytest.mark.parametrize("kind", ["nic", "transformer"])
def test_no_repeat_ngram_size_blocks_loops(kind: str, vocab: CaptionVocab) -> None:
    model = tiny(kind, vocab)
    with torch.no_grad():  # a planted loop: "a" then "dog" are every step's most likely words
        model.out.bias[vocab.encode("a", "humor")[2]] = 80.0
        model.out.bias[vocab.encode("dog", "humor")[2]] = 60.0
    features = torch.randn(2, 8)
    plain = greedy_decode(model, features, "humor", max_len=8, no_repeat_ngram_size=0)
    assert plain[0].split() == ["a"] * 8  # the loop, unblocked
    for n in (1, 2, 3):
        greedy = greedy_decode(model, features, "humor", max_len=8, no_repeat_ngram_size=n)
        beams = beam_decode(model, features, "humor", beam_size=3, max_len=8, no_repeat_ngram_size=n)
        written = greedy + [caption for candidates in beams for caption, _ in candidates]
        for caption in written:
            grams = _ngrams(caption, n)
            assert len(grams) == len(set(grams)), (n, caption)
        # the n-th "a" in a row would repeat an n-gram: blocking moves on to the next best word
        assert greedy[0].split()[:n + 1] == ["a"] * n + ["dog"]
