"""Tests of the Extract step's attention scoring (Eq. 1), head selection (Eq. 2), phrase/content split and views.

The head-selection test plants a style head: a tiny BERT (MiniLM's tokenizer, 2 layers x 4 heads) in which every
head attends uniformly except head (1, 2), whose [CLS] query is tuned to the marker words that carry the style; the
classifier is then fine-tuned on a synthetic corpus (style = presence of a marker) with the attention patterns
frozen. Removing the planted head's top words removes the style, so Eq. 2 must pick (1, 2).
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: no model hub here

import math

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from models.backbones import minilm_path
from models.importance_render import confidence_heatmap_png, importance_html, importance_png, shading
from models.style_classifier import StyleClassifier, fine_tune, load_style_classifier
from models.style_phrases import (extract_style_phrases, phrase_size, select_style_head, split_caption,
                                  top_k_masks, validate_eps, word_importance)
from models.text import caption_words

# One intra-op thread: on a shared 2-core machine two OpenMP threads contend and run ~8x slower.
torch.set_num_threads(1)

LABELS = ["factual", "humor", "romantic"]
MARKERS = {"humor": ["funny", "silly", "hilarious"], "romantic": ["love", "romantic", "lovely"]}
CONTENT = ("a the dog man woman boy girl cat horse runs sits walks jumps stands on in near with grass beach "
           "street park field ball red blue small big two").split()
PLANTED = (1, 2)
MARKER_DIM = 0  # hidden dimension that flags a marker word in the embeddings


def synthetic_corpus(n_per_label: int, seed: int) -> tuple[list[str], list[str]]:
    """Captions of 8-10 content words; a stylized one carries one marker of its style after position 3."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for label in LABELS:
        for _ in range(n_per_label):
            words = list(rng.choice(CONTENT, size=int(rng.integers(8, 11))))
            if label != "factual":
                words.insert(int(rng.integers(4, len(words) + 1)), str(rng.choice(MARKERS[label])))
            texts.append(" ".join(words))
            labels.append(label)
    return texts, labels


def planted_backbone(tokenizer, path) -> None:
    """Save a tiny BERT whose only non-uniform attention is head PLANTED, looking at marker words."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = BertModel(config, add_pooling_layer=True)
    head_dim = config.hidden_size // config.num_attention_heads
    marker_ids = [tokenizer.convert_tokens_to_ids(word) for words in MARKERS.values() for word in words]
    with torch.no_grad():
        embeddings = model.embeddings
        embeddings.word_embeddings.weight.normal_(0.0, 1.0)
        embeddings.word_embeddings.weight[:, MARKER_DIM] = 0.0
        embeddings.word_embeddings.weight[marker_ids, MARKER_DIM] = 4.0
        embeddings.position_embeddings.weight[:, MARKER_DIM] = 0.0
        embeddings.token_type_embeddings.weight[:, MARKER_DIM] = 0.0
        for layer in model.encoder.layer:
            for projection in (layer.attention.self.query, layer.attention.self.key):
                projection.weight.zero_()
                projection.bias.zero_()
        first = model.encoder.layer[0]  # layer 0 passes its input through unchanged
        for dense in (first.attention.output.dense, first.output.dense):
            dense.weight.zero_()
            dense.bias.zero_()
        attention = model.encoder.layer[PLANTED[0]].attention.self
        row = PLANTED[1] * head_dim
        attention.query.bias[row] = 30.0
        attention.key.weight[row, MARKER_DIM] = 1.0
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


@pytest.fixture(scope="module")
def minilm_tokenizer():
    return AutoTokenizer.from_pretrained(minilm_path())


@pytest.fixture(scope="module")
def planted_classifier(tmp_path_factory, minilm_tokenizer) -> StyleClassifier:
    path = tmp_path_factory.mktemp("planted")
    planted_backbone(minilm_tokenizer, path)
    clf = load_style_classifier(str(path), LABELS, device="cpu", max_length=32)
    frozen = ("embeddings.", "encoder.layer.0.", ".attention.self.query.", ".attention.self.key.")
    for name, parameter in clf.model.named_parameters():
        parameter.requires_grad = not any(part in name for part in frozen)
    texts, labels = synthetic_corpus(60, seed=1)
    fine_tune(clf, texts, labels, epochs=8, batch_size=16, lr=5e-3, weight_decay=0.0, warmup_ratio=0.1, seed=0)
    return clf


def test_planted_classifier_learned_the_markers(planted_classifier):
    texts, labels = synthetic_corpus(20, seed=2)
    assert planted_classifier.evaluate(texts, labels)["accuracy"] >= 0.95


def test_head_selection_picks_the_planted_head(planted_classifier):
    texts, labels = synthetic_corpus(15, seed=3)
    stylized = [(text, label) for text, label in zip(texts, labels) if label != "factual"]
    selection = select_style_head(planted_classifier, [t for t, _ in stylized], [s for _, s in stylized], eps=0.25,
                                  batch_size=16)
    assert (selection.layer, selection.head) == PLANTED
    assert selection.confidence.shape == (2, 4)
    assert selection.n_captions == len(stylized)
    others = np.delete(selection.confidence.ravel(), PLANTED[0] * 4 + PLANTED[1])
    assert selection.confidence[PLANTED] < 0.1 * others.min()
    # a capped, seeded selection set still finds the head and is reproducible
    capped = [select_style_head(planted_classifier, [t for t, _ in stylized], [s for _, s in stylized],
                                max_captions=10, seed=5) for _ in range(2)]
    assert capped[0].n_captions == 10 and (capped[0].layer, capped[0].head) == PLANTED
    np.testing.assert_allclose(capped[0].confidence, capped[1].confidence)


def test_planted_head_extracts_the_marker(planted_classifier):
    texts, labels = synthetic_corpus(10, seed=4)
    records = extract_style_phrases(planted_classifier, texts, *PLANTED, eps=0.25)
    for text, label, record in zip(texts, labels, records):
        words = caption_words(text)
        assert len(record.phrase_words) == phrase_size(len(words), 0.25)
        markers = [word for word in words if word in MARKERS.get(label, [])]
        assert set(markers) <= set(record.phrase_words)
        if label != "factual":
            assert max(record.importance) > 0.9  # the planted head looks at the marker almost alone
        assert record.reassemble() == words


def test_uniform_heads_give_equal_importance(planted_classifier):
    (importance,) = word_importance(planted_classifier, ["a dog runs on the grass"])
    assert importance.shape == (2, 4, 6)
    np.testing.assert_allclose(importance[0], 1.0 / 8, rtol=1e-5)  # 6 words + [CLS] + [SEP], uniform


def test_phrase_size_rule():
    assert [phrase_size(t, 0.25) for t in range(0, 10)] == [0, 0, 1, 1, 1, 2, 2, 2, 2, 3]
    assert phrase_size(10, 0.7) == 7  # 0.7 * 10 is 7.000000000000001 in floats
    assert phrase_size(2, 0.99) == 1 and phrase_size(4, 0.9) == 3  # capped at T - 1
    for eps in (0.0, 1.0, -0.1, 1.5, float("nan"), "0.25", True):
        with pytest.raises(ValueError, match="eps"):
            validate_eps(eps)
    with pytest.raises(ValueError, match="eps"):
        phrase_size(5, 1.0)


def test_top_k_masks_ties_go_to_earlier_words():
    masks = top_k_masks(np.array([[0.1, 0.3, 0.3, 0.2], [0.0, 0.0, 0.0, 0.0]]), 2)
    assert masks.tolist() == [[False, True, True, False], [True, True, False, False]]


def test_split_caption_reassembles_and_handles_short_captions():
    words = ["a", "man", "in", "love", "with", "the", "sea"]
    record = split_caption(words, np.array([0.0, 0.1, 0.05, 0.5, 0.02, 0.01, 0.3]), 0.25, 3, 7)
    assert record.phrase_words == ["love", "sea"]  # k = ceil(0.25 * 7) = 2, in caption order
    assert record.style_phrase == "love sea" and record.content == "a man in with the"
    assert record.phrase_mask == [False, False, False, True, False, False, True]
    assert record.reassemble() == words and record.content_words == ["a", "man", "in", "with", "the"]
    assert (record.layer, record.head, record.eps) == (3, 7, 0.25)
    empty = split_caption([], np.zeros(0), 0.25, 0, 0)
    assert (empty.style_phrase, empty.content, empty.phrase_mask, empty.reassemble()) == ("", "", [], [])
    one = split_caption(["hilarious"], np.array([0.9]), 0.25, 0, 0)
    assert (one.style_phrase, one.content, one.phrase_mask) == ("", "hilarious", [False])
    with pytest.raises(ValueError, match="one importance score per word"):
        split_caption(["a", "b"], np.zeros(3), 0.25, 0, 0)


@pytest.fixture(scope="module")
def minilm() -> StyleClassifier:
    return load_style_classifier("all-MiniLM-L6-v2", ["factual", "humor", "romantic"], device="cpu")


def test_minilm_importance_merges_word_pieces(minilm):
    captions = ["The child plays croquette, enjoying the magic of youth!", "", "dogs"]
    importance = word_importance(minilm, captions, batch_size=2)
    assert [imp.shape for imp in importance] == [(6, 12, 11), (6, 12, 0), (6, 12, 1)]
    for imp in importance:
        assert np.all(imp >= 0) and np.all(imp.sum(axis=-1) <= 1 + 1e-5)
    assert importance[0].sum(axis=-1).mean() > 0.1  # some heads park on [CLS]/[SEP], but not all
    # recompute caption 0 by hand from the raw attentions: sum of each word's pieces
    words = caption_words(captions[0])
    encoding = minilm.encode_words([words])
    with torch.inference_mode():
        attentions = minilm.model(**encoding, output_attentions=True).attentions
    cls_rows = torch.stack([layer[0, :, 0, :] for layer in attentions]).numpy()  # [L, H, S]
    word_ids = encoding.word_ids(0)
    assert len([wid for wid in word_ids if wid == words.index("croquette")]) > 1  # a multi-piece word
    expected = np.zeros((6, 12, len(words)))
    for piece, wid in enumerate(word_ids):
        if wid is not None:
            expected[:, :, wid] += cls_rows[:, :, piece]
    np.testing.assert_allclose(importance[0], expected, rtol=1e-5, atol=1e-7)


def test_minilm_extraction_and_selection_contracts(minilm):
    captions = ["two dogs in love are playing together in the snow with full joy", "love", "",
                "a dog chases gold nuggets in the snow ."]
    records = extract_style_phrases(minilm, captions, layer=5, head=11, eps=0.25)
    assert [len(r.phrase_words) for r in records] == [4, 0, 0, 2]
    for caption, record in zip(captions, records):
        assert record.reassemble() == caption_words(caption)
        assert len(record.importance) == len(record.tokens) == len(record.phrase_mask)
        top = sorted(range(len(record.tokens)), key=lambda i: -record.importance[i])[:len(record.phrase_words)]
        assert sorted(top) == [i for i, m in enumerate(record.phrase_mask) if m]
    with pytest.raises(ValueError, match="out of range"):
        extract_style_phrases(minilm, captions, layer=6, head=0)
    with pytest.raises(ValueError, match="eps"):
        extract_style_phrases(minilm, captions, layer=0, head=0, eps=1.0)
    with pytest.raises(ValueError, match="not stylized labels"):
        select_style_head(minilm, captions[:1], ["factual"])
    with pytest.raises(ValueError, match="at least two words"):
        select_style_head(minilm, ["love", ""], ["romantic", "humor"])
    selection = select_style_head(minilm, [captions[0], captions[3], "love"], ["romantic", "humor", "humor"])
    assert selection.n_captions == 2 and selection.confidence.shape == (6, 12)
    assert np.all(selection.confidence > 0) and math.isfinite(float(selection.confidence.max()))
    assert selection.confidence[selection.layer, selection.head] == selection.confidence.min()


def test_table4_views_and_heatmap(tmp_path):
    records = [split_caption(["a", "man", "in", "love"], np.array([0.1, 0.0, 0.2, 0.6]), 0.25, 1, 2),
               split_caption(["a", "<silly>", "dog"], np.array([0.0, 0.5, 0.25]), 0.25, 1, 2),
               split_caption([], np.zeros(0), 0.25, 1, 2),
               split_caption(["two", "cats"], np.array([0.3, 0.3]), 0.25, 1, 2)]
    styles = ["romantic", "humor", "humor", "romantic"]
    page = importance_html(records, styles, per_style=1)
    assert page.count("<tr><td>") == 2  # one caption per style
    assert "rgba(214,39,40,1.000);font-weight:bold" in page and "&lt;silly&gt;" in page
    assert "rgba(214,39,40,0.167)" in page  # 0.1 / 0.6 for "a" in the romantic caption
    np.testing.assert_allclose(shading(records[1]), [0.0, 1.0, 0.5])
    assert shading(records[2]).shape == (0,)
    png = importance_png(records, styles, tmp_path / "table4.png")
    heat = confidence_heatmap_png(np.arange(8.0).reshape(2, 4), (1, 2), tmp_path / "sub" / "heat.png")
    for path in (png, heat):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 2000
    with pytest.raises(ValueError, match="outside"):
        confidence_heatmap_png(np.zeros((2, 4)), (2, 0), tmp_path / "bad.png")
    with pytest.raises(ValueError, match="differ in length"):
        importance_html(records, styles[:2])


def test_eq2_uses_only_the_other_styles_of_the_set():
    """Hand-made probabilities over [factual, humor, romantic, positive]: for humor in {humor, romantic}, S' is
    romantic alone, so c = 0.5 / 0.2 = 2.5 (not 0.5 / (0.2 + 0.2), nor with factual in the sum)."""
    from models.style_phrases import eq2_confidence

    proba = np.array([[0.1, 0.5, 0.2, 0.2], [0.4, 0.1, 0.25, 0.25]])
    log_proba = np.log(proba)
    np.testing.assert_allclose(eq2_confidence(log_proba, own=1, others=[2]), [2.5, 0.4])
    np.testing.assert_allclose(eq2_confidence(log_proba, own=1, others=[2, 3]), [1.25, 0.2])
    stacked = np.broadcast_to(log_proba[:, None, None, :], (2, 3, 4, 4))  # [n, L, H, labels]
    assert eq2_confidence(stacked, 1, [2]).shape == (2, 3, 4)
    with pytest.raises(ValueError, match="at least one other style"):
        eq2_confidence(log_proba, 1, [])
    with pytest.raises(ValueError, match="cannot also be"):
        eq2_confidence(log_proba, 1, [1, 2])


class _FixedClassifier:
    """A stand-in classifier over styles only, whose log-probabilities are fixed per caption."""

    def __init__(self, labels, proba_by_words):
        self.labels, self.styles, self.proba = labels, labels, proba_by_words

    def label_index(self, label):
        return self.labels.index(label)


def test_comparison_columns_follow_the_style_sets():
    from models.style_phrases import comparison_columns

    clf = _FixedClassifier(["humor", "romantic", "positive", "negative"], None)
    assert comparison_columns(clf) == {"humor": [1, 2, 3], "romantic": [0, 2, 3], "positive": [0, 1, 3],
                                       "negative": [0, 1, 2]}
    sets = {"humor": ["romantic"], "romantic": ["humor"], "positive": ["negative"], "negative": ["positive"]}
    assert comparison_columns(clf, sets) == {"humor": [1], "romantic": [0], "positive": [3], "negative": [2]}
    with pytest.raises(ValueError, match="other styles"):
        comparison_columns(clf, {"humor": ["humor"]})


def test_styles_only_classifier_round_trips(tmp_path):
    """The extractor's per-set classifier has the set's styles as labels and no factual class."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    BertModel(config).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    clf = load_style_classifier(str(tmp_path / "tiny"), ["humor", "romantic"], device="cpu", max_length=16,
                                with_factual=False)
    assert clf.styles == clf.labels == ["humor", "romantic"] and clf.factual_label is None
    again = StyleClassifier.load(clf.save(tmp_path / "clf"), device="cpu", max_length=16)
    assert again.styles == ["humor", "romantic"] and again.factual_label is None
    with pytest.raises(ValueError, match="with_factual"):
        load_style_classifier(str(tmp_path / "clf"), ["humor", "romantic"], device="cpu", with_factual=True)
    with pytest.raises(ValueError, match="at least two styles"):
        load_style_classifier(str(tmp_path / "tiny"), ["humor"], device="cpu", with_factual=False)
    words = [caption_words("a funny dog runs on the beach"), caption_words("a lovely girl in the park")]
    confidence = __import__("models.style_phrases", fromlist=["head_confidence"]).head_confidence(
        again, [" ".join(w) for w in words], ["humor", "romantic"], eps=0.25, batch_size=2)
    proba = again.predict_proba([" ".join(w) for w in words])
    assert confidence.shape == (2, 2, 2) and np.all(confidence > 0)
    assert np.all(confidence[0] <= 1e6) and proba.shape == (2, 2)
