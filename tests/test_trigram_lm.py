"""Tests of the interpolated Kneser-Ney trigram LM that filters generated captions by perplexity.

A tiny corpus checks the smoothing against values worked out by hand; real FlickrStyle10K humor and romantic
captions check that each style's LM prefers its own held-out captions, and that 10k sentences score in seconds.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from models.trigram_lm import FALLBACK_DISCOUNT, StyleLanguageModels, TrigramLM

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "flickrstyle10k"
N_TRAIN = 6000


@pytest.fixture(scope="module")
def tiny() -> TrigramLM:
    return TrigramLM.train(["a b", "a c"], discounts=(0.5, 0.5, 0.5))


@pytest.fixture(scope="module")
def styled() -> dict[str, list[str]]:
    if not DATA.is_dir():
        pytest.skip(f"FlickrStyle10K captions not found at {DATA}")
    return {
        "humor": (DATA / "funny_train.txt").read_text(encoding="utf-8").splitlines(),
        "romantic": (DATA / "romantic_train.txt").read_text(encoding="latin-1").splitlines(),
    }


@pytest.fixture(scope="module")
def style_lms(styled) -> StyleLanguageModels:
    captions = styled["humor"][:N_TRAIN] + styled["romantic"][:N_TRAIN]
    return StyleLanguageModels.train(captions, ["humor"] * N_TRAIN + ["romantic"] * N_TRAIN)


def test_known_values_on_a_hand_checkable_corpus(tiny):
    # V = {</s>, <unk>, a, b, c}; bigram types: (<s>,a) (a,b) (b,</s>) (a,c) (c,</s>); D = 0.5 at every order.
    # P1(b) = (1 - .5)/5 + .5 * 4/5 / 5 = 0.18;  P1(</s>) = 1.5/5 + 0.08 = 0.38;  P1(<unk>) = 0.08
    # P2(b|a) = (1 - .5)/2 + .5 * 2/2 * 0.18 = 0.34;  P3(b|<s>,a) = (1 - .5)/2 + .5 * 2/2 * 0.34 = 0.42
    assert tiny.prob("b", ("<s>", "a")) == pytest.approx(0.42)
    assert tiny.prob("zebra", ("<s>", "a")) == pytest.approx(0.5 * 0.5 * 0.08)  # unseen word -> <unk>
    assert tiny.prob("</s>", ("q", "r")) == pytest.approx(0.38)  # unseen context -> unigram
    # P3(a|<s>,<s>) = 1.5/2 + .25 * P2(a|<s>) with P2(a|<s>) = .5 + .5 * .18; P3(</s>|a,b) = .5 + .5 * (.5 + .5 * .38)
    p_a, p_b, p_end = 0.75 + 0.25 * 0.59, 0.42, 0.5 + 0.5 * 0.69
    assert tiny.perplexity("a b") == pytest.approx(math.exp(-(math.log(p_a) + math.log(p_b) + math.log(p_end)) / 3))
    assert tiny.perplexity("A b.") == pytest.approx(tiny.perplexity("a b"))  # same caption_words


@pytest.mark.parametrize("context", [("<s>", "<s>"), ("<s>", "a"), ("a", "b"), ("b", "a"), ("q", "r")])
def test_next_word_distribution_sums_to_one_on_tiny_corpus(tiny, context):
    dist = tiny.next_word_distribution(context)
    assert set(dist) == {"</s>", "<unk>", "a", "b", "c"}
    assert sum(dist.values()) == pytest.approx(1.0, abs=1e-12) and min(dist.values()) > 0


def test_next_word_distribution_sums_to_one_on_real_captions(style_lms):
    lm = style_lms["romantic"]
    for context in [("<s>", "<s>"), ("<s>", "a"), ("a", "dog"), ("in", "love"), ("zzz", "love"), ("love", "zzz")]:
        dist = np.array(list(lm.next_word_distribution(context).values()))
        assert len(dist) == lm.size - 1 and dist.sum() == pytest.approx(1.0, abs=1e-9) and dist.min() > 0


def test_estimated_discounts(style_lms, tiny):
    assert all(0 < d < 1 for d in style_lms["humor"].discounts)
    # In ["a b", "a c"] every bigram continuation count is 1 (no n2), so D2 falls back.
    assert TrigramLM.train(["a b", "a c"]).discounts[1] == FALLBACK_DISCOUNT


def test_in_style_perplexity_is_lower_than_out_of_style(styled, style_lms):
    for style, other in [("humor", "romantic"), ("romantic", "humor")]:
        held_out = styled[style][N_TRAIN:]
        own = style_lms.perplexities(held_out, [style] * len(held_out))
        foreign = style_lms.perplexities(held_out, [other] * len(held_out))
        assert np.median(own) < 0.95 * np.median(foreign)  # measured: 111 vs 126, 83 vs 99
        assert (own < foreign).mean() > 0.55  # measured: humor 0.59, romantic 0.66
        assert np.isfinite(own).all() and (own > 1).all()


def test_scores_ten_thousand_sentences_in_seconds(styled, style_lms):
    sentences = (styled["humor"][N_TRAIN:] + styled["romantic"][N_TRAIN:]) * 5
    styles = (["humor"] * 1000 + ["romantic"] * 1000) * 5
    start = time.perf_counter()
    ppl = style_lms.perplexities(sentences, styles)
    assert time.perf_counter() - start < 5.0
    assert ppl.shape == (10_000,)
    single = style_lms["humor"]
    assert ppl[0] == pytest.approx(single.perplexity(sentences[0]))
    assert ppl[1000] == pytest.approx(style_lms["romantic"].perplexity(sentences[1000]))


def test_json_round_trip(style_lms, styled, tmp_path):
    path = style_lms.save(tmp_path / "lms.json")
    again = StyleLanguageModels.load(path)
    assert again.styles == ["humor", "romantic"]
    sample = styled["humor"][N_TRAIN : N_TRAIN + 200]
    np.testing.assert_allclose(again["humor"].perplexities(sample), style_lms["humor"].perplexities(sample))
    one = TrigramLM.from_dict(json.loads(json.dumps(style_lms["romantic"].to_dict())))
    assert one.discounts == style_lms["romantic"].discounts


def test_min_count_maps_rare_words_to_unk():
    lm = TrigramLM.train(["a dog runs", "a dog sits", "a cat naps"], min_count=2)
    assert lm.vocab == ["<s>", "</s>", "<unk>", "a", "dog"]
    assert lm.perplexity("a dog flies") == pytest.approx(lm.perplexity("a dog runs"))


def test_bad_input_is_rejected(style_lms):
    with pytest.raises(ValueError, match="non-empty list of strings"):
        TrigramLM.train([])
    with pytest.raises(ValueError, match="min_count"):
        TrigramLM.train(["a b"], min_count=0)
    with pytest.raises(ValueError, match="two words"):
        style_lms["humor"].next_word_distribution(("a",))
    with pytest.raises(ValueError, match="no trigram LM for style 'positive'"):
        style_lms.perplexities(["a dog"], ["positive"])
    with pytest.raises(ValueError, match="same length"):
        style_lms.perplexities(["a dog"], [])
    with pytest.raises(ValueError, match="must be strings"):
        style_lms["humor"].perplexities([None])
    with pytest.raises(ValueError, match="format"):
        TrigramLM.from_dict({"format": "arpa"})


def test_skipping_oov_words_scores_only_known_words(tiny):
    # "a zebra" scores a, then zebra (<unk>, skipped), then </s> after the context (a, <unk>)
    logp, oov, lengths = tiny.token_log_probs(["a zebra"])
    assert oov.tolist() == [False, True, False] and lengths.tolist() == [3]
    assert tiny.perplexities(["a zebra"], oov="skip")[0] == pytest.approx(math.exp(-(logp[0] + logp[2]) / 2))
    assert tiny.perplexities(["a zebra"], oov="skip")[0] < tiny.perplexities(["a zebra"])[0]
    assert tiny.perplexities(["a b"], oov="skip")[0] == pytest.approx(tiny.perplexity("a b"))  # nothing to skip
    with pytest.raises(ValueError, match="oov"):
        tiny.perplexities(["a b"], oov="ignore")


def test_from_counts_equals_training_on_the_sentences():
    from collections import Counter

    from models.trigram_lm import sentence_trigrams

    sentences = ["a dog runs in the park", "a dog sits", "the cat naps in the sun", "a cat runs"]
    counts = Counter(t for s in sentences for t in sentence_trigrams(s))
    built = TrigramLM.from_counts(list(counts), list(counts.values()))
    trained = TrigramLM.train(sentences)
    probe = ["a dog naps in the sun", "the park runs", "zebra"]
    np.testing.assert_allclose(built.perplexities(probe), trained.perplexities(probe))
    # min_count: the words seen once ("runs" twice stays) become <unk> exactly as train() maps them
    rare_built = TrigramLM.from_counts(list(counts), list(counts.values()), min_count=2)
    rare_trained = TrigramLM.train(sentences, min_count=2)
    assert rare_built.vocab == rare_trained.vocab and "runs" in rare_built.vocab and "park" not in rare_built.vocab
    np.testing.assert_allclose(rare_built.perplexities(probe), rare_trained.perplexities(probe))
    with pytest.raises(ValueError, match="min_count"):
        TrigramLM.from_counts(list(counts), list(counts.values()), min_count=0)


def test_unscored_share_counts_the_tokens_skip_leaves_out():
    lms = StyleLanguageModels.train(["a dog runs", "a dog sits"] * 3 + ["a cat naps"], ["humor"] * 7, min_count=2,
                                    oov="skip")
    # "a dog flies": a, dog, flies (<unk>: "flies" unseen), </s>; "a cat naps": cat and naps seen once -> <unk>
    assert lms.unscored_share(["a dog flies"], ["humor"]) == pytest.approx(1 / 4)
    assert lms.unscored_share(["a cat naps", "a dog runs"], ["humor", "humor"]) == pytest.approx(2 / 8)
    assert lms.unscored_share([], []) == 0.0


def test_em_weights_prefer_the_component_that_fits_held_out_text():
    from models.trigram_lm import fit_mixture_weights

    good, bad = np.log(np.full(200, 0.5)), np.log(np.full(200, 0.01))
    weights = fit_mixture_weights(np.stack([bad, good]))
    assert weights.sum() == pytest.approx(1.0) and weights[1] > 0.95


def test_background_folds_never_score_a_caption_with_its_own_fold(styled, tmp_path):
    from models.trigram_lm import fold_of

    humor = styled["humor"][:2000]
    factual_a = ["a dog runs on the grass", "a man rides a red bike down the street"] * 20
    factual_b = ["two children play in the snow", "a woman sits on a bench"] * 20
    backgrounds = [TrigramLM.train(factual_a), TrigramLM.train(factual_b)]
    lms = StyleLanguageModels.train(humor, ["humor"] * len(humor), backgrounds=backgrounds,
                                    held_out={"humor": styled["humor"][2000:2300]}, oov="skip")
    w = lms.weights["humor"]
    assert len(w) == 2 and w.sum() == pytest.approx(1.0) and w[0] > w[1] > 0  # own style first, background second
    caption = "a dog runs on the grass"
    own_fold = lms.perplexities([caption], ["humor"], folds=[0])[0]   # scored by fold 1's LM: it never saw it
    other_fold = lms.perplexities([caption], ["humor"], folds=[1])[0]  # scored by fold 0's LM: it saw it
    assert other_fold < own_fold
    assert fold_of("coco:42", 2) == fold_of("coco:42", 2) in (0, 1)
    again = StyleLanguageModels.load(lms.save(tmp_path / "lms.json"))
    assert again.oov == "skip" and again.weights["humor"] == pytest.approx(w)
    assert again.perplexities([caption], ["humor"], folds=[0])[0] == pytest.approx(own_fold)
    with pytest.raises(ValueError, match="two folds"):
        StyleLanguageModels(lms.models, backgrounds[:1])
