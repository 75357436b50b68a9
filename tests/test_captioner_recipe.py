"""The paper's captioner recipe on tiny real models: Up-Down attention over region-like vectors (padding masked),
scheduled sampling (0.05 more every 5 epochs), Adam, and training on padded regions with a regions column."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from models.captioner_training import (read_caption_parquet, sampling_probability, scheduled_sampling_loss,
                                       train_worker, train_workers)
from models.captioners import (CAPTIONER_KINDS, CaptionVocab, UpDownCaptioner, build_captioner, greedy_decode,
                               load_captioner, save_captioner, teacher_forcing_loss)

torch.set_num_threads(1)

CAPTIONS = ["a silly dog runs on the grass", "a lovely cat sleeps on the sofa", "a silly kid plays in the snow",
            "a lovely man rides a bike"]
UPDOWN = {"embed_dim": 16, "hidden_dim": 24, "att_dim": 12, "dropout": 0.0}
PAPER = {"start": 0.0, "increase": 0.05, "every_epochs": 5, "max": 0.25}


@pytest.fixture()
def vocab() -> CaptionVocab:
    return CaptionVocab.build(CAPTIONS, ["humor"])


def test_updown_is_a_captioner_kind_that_masks_padded_regions(vocab: CaptionVocab, tmp_path: Path) -> None:
    assert "updown" in CAPTIONER_KINDS
    torch.manual_seed(0)
    model = build_captioner("updown", 8, vocab, **UPDOWN).eval()
    assert isinstance(model, UpDownCaptioner)
    regions = torch.randn(2, 3, 8)
    tokens = vocab.encode_batch(CAPTIONS[:2], ["humor", "humor"])
    padded = torch.cat([regions, 100 * torch.randn(2, 2, 8)], dim=1)  # two junk regions, masked out
    mask = torch.tensor([[False] * 3 + [True] * 2] * 2)
    with torch.no_grad():
        plain = model(regions, tokens)
        masked = model(padded, tokens, mask)
        unmasked = model(padded, tokens)
    assert plain.shape == (2, tokens.shape[1], len(vocab))
    assert torch.allclose(plain, masked, atol=1e-5)  # padding changes nothing when masked
    assert not torch.allclose(plain, unmasked, atol=1e-3)  # and does when it is not
    save_captioner(model, tmp_path / "m")
    again = load_captioner(tmp_path / "m")
    with torch.no_grad():
        assert torch.allclose(again(regions, tokens), plain, atol=1e-6)


def test_updown_learns_to_caption_by_attending_to_regions(vocab: CaptionVocab) -> None:
    torch.manual_seed(1)
    model = build_captioner("updown", 8, vocab, **UPDOWN)
    # image i: region i carries the signal, the others are noise the model must learn to ignore
    features = 0.1 * torch.randn(4, 4, 8)
    features[torch.arange(4), torch.arange(4)] += 3 * torch.eye(4, 8)
    tokens = vocab.encode_batch(CAPTIONS, ["humor"] * 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(150):
        optimizer.zero_grad()
        teacher_forcing_loss(model, features, tokens, vocab.pad_id).backward()
        optimizer.step()
    assert greedy_decode(model, features, "humor", max_len=10, no_repeat_ngram_size=0) == CAPTIONS


def test_scheduled_sampling_probability_rises_005_every_5_epochs() -> None:
    assert [sampling_probability(PAPER, e) for e in (0, 4, 5, 9, 10, 15, 20, 99)] == pytest.approx(
        [0.0, 0.0, 0.05, 0.05, 0.10, 0.15, 0.20, 0.25])
    assert sampling_probability(None, 50) == 0.0
    with pytest.raises(ValueError, match="every_epochs must be a positive integer"):
        sampling_probability({**PAPER, "every_epochs": 0}, 1)
    with pytest.raises(ValueError, match="scheduled_sampling.increase must be a number in \\[0, 1\\]"):
        sampling_probability({**PAPER, "increase": 2}, 1)


def test_scheduled_sampling_loss_feeds_back_samples(vocab: CaptionVocab) -> None:
    torch.manual_seed(2)
    model = build_captioner("nic", 8, vocab, embed_dim=16, hidden_dim=24, dropout=0.0)
    features = torch.randn(4, 8)
    tokens = vocab.encode_batch(CAPTIONS, ["humor"] * 4)
    forced = teacher_forcing_loss(model, features, tokens, vocab.pad_id).detach()
    assert float(scheduled_sampling_loss(model, features, tokens, vocab.pad_id, 0.0).detach()) == pytest.approx(float(forced))
    seen: list[torch.Tensor] = []
    original_forward = model.forward

    def spy(f, t, mask=None):
        seen.append(t.clone())
        return original_forward(f, t, mask)

    model.forward = spy  # type: ignore[method-assign]
    generator = torch.Generator().manual_seed(0)
    loss = scheduled_sampling_loss(model, features, tokens, vocab.pad_id, 1.0, generator=generator)
    assert torch.isfinite(loss)
    first, second = seen
    assert torch.equal(first, tokens[:, :-1])  # the sampling pass sees the gold words
    assert torch.equal(second[:, :2], tokens[:, :2])  # style token and <bos> are always given
    words = tokens[:, 2:-1] != vocab.pad_id
    assert not torch.equal(second[:, 2:][words], tokens[:, 2:-1][words])  # p = 1: every word is a sample


def test_training_on_padded_regions_with_adam_and_scheduled_sampling(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    dim, regions = 8, 4
    rows = []
    for i, caption in enumerate(CAPTIONS * 6):
        n = 1 + i % regions
        feats = np.zeros((regions, dim), dtype=np.float32)
        feats[:n] = rng.normal(size=(n, dim)) * 0.05
        feats[0, CAPTIONS.index(caption)] += 2.0
        rows.append((feats.reshape(-1).tolist(), n, "humor", caption))
    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"features": [r[0] for r in rows], "n_regions": pa.array([r[1] for r in rows], pa.int32()),
                             "style": [r[2] for r in rows], "caption": [r[3] for r in rows]}), path)
    data = read_caption_parquet([str(path)], feature_regions=regions, regions_column="n_regions")
    assert data.features.shape == (24, regions, dim)
    assert data.padding_mask()[:4].tolist() == [[False, True, True, True], [False, False, True, True],
                                                [False, False, False, True], [False] * 4]
    summary = train_worker({"train_paths": [str(path)], "output_dir": str(tmp_path / "model"), "kind": "updown",
                            "hparams": UPDOWN, "epochs": 12, "batch_size": 8, "lr": 0.02, "optimizer": "adam",
                            "device": "cpu", "feature_regions": regions, "regions_column": "n_regions",
                            "scheduled_sampling": {"start": 0.0, "increase": 0.05, "every_epochs": 5, "max": 0.25}})
    assert summary["sampling_probability"] == pytest.approx([0.0] * 5 + [0.05] * 5 + [0.1] * 2)
    assert summary["loss_last"] < summary["loss_first"] / 2
    assert summary["config"]["optimizer"] == "adam"
    with pytest.raises(ValueError, match="must count 1..2 real regions"):
        read_caption_parquet([str(path)], feature_regions=2, regions_column="n_regions")
    with pytest.raises(ValueError, match="optimizer must be one of"):
        train_worker({"train_paths": [str(path)], "output_dir": str(tmp_path / "x"), "optimizer": "sgd"})


def test_several_captioners_train_in_one_launch(tmp_path: Path) -> None:
    """``train_workers``: the cells of an experiment train one after the other in the same process (group)."""
    features = np.eye(4, 8, dtype=np.float32)
    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"features": [features[i].tolist() for i in range(4)] * 4, "style": ["humor"] * 16,
                             "caption": CAPTIONS * 4}), path)
    base = {"train_paths": [str(path)], "epochs": 2, "batch_size": 8, "device": "cpu"}
    summaries = train_workers([{**base, "output_dir": str(tmp_path / "a"), "kind": "nic",
                                "hparams": {"embed_dim": 8, "hidden_dim": 8}},
                               {**base, "output_dir": str(tmp_path / "b"), "kind": "updown", "hparams": UPDOWN}])
    assert [s["config"]["kind"] for s in summaries] == ["nic", "updown"]
    assert all(s["steps"] == 4 and s["seconds"] > 0 for s in summaries)
    assert load_captioner(tmp_path / "b").kind == "updown" and load_captioner(tmp_path / "a").kind == "nic"
    with pytest.raises(ValueError, match="same device and backend"):
        train_workers([{**base, "output_dir": str(tmp_path / "c")}, {**base, "output_dir": str(tmp_path / "d"),
                                                                      "device": "auto"}])


def test_inserted_word_weights_mark_the_words_an_augmented_caption_adds(vocab: CaptionVocab) -> None:
    captions = ["a silly dog runs on the silly grass", "a dog runs on the grass", "a lovely cat sleeps"]
    sources = ["a dog runs on the grass", None, ""]
    weights = vocab.inserted_word_weights(captions, sources, 4.0)
    tokens = vocab.encode_batch(captions, ["humor"] * 3)
    assert weights.shape == tokens.shape
    # <style> <bos> a silly dog runs on the silly grass <eos>: both "silly" were inserted, nothing else
    assert weights[0].tolist() == [1, 1, 1, 4, 1, 1, 1, 1, 4, 1, 1]
    assert (weights[1:] == 1).all()  # original pairs (no source) are plain
    assert vocab.inserted_word_weights(captions[:1], sources[:1], 4.0, max_words=2)[0].tolist()[:5] == [1, 1, 1, 4, 1]
    with pytest.raises(ValueError, match="finite number > 0"):
        vocab.inserted_word_weights(captions, sources, 0.0)


def test_caption_loss_weights_each_predicted_word(vocab: CaptionVocab) -> None:
    from models.captioners import caption_loss

    torch.manual_seed(4)
    tokens = vocab.encode_batch(CAPTIONS[:2], ["humor"] * 2)
    logits = torch.randn(2, tokens.shape[1] - 1, len(vocab))
    plain = caption_loss(logits, tokens, vocab.pad_id)
    assert float(caption_loss(logits, tokens, vocab.pad_id, torch.ones(tokens.shape))) == pytest.approx(float(plain))
    weights = torch.ones(tokens.shape)
    weights[0, 3] = 3.0  # the second word of the first caption
    each = torch.nn.functional.cross_entropy(logits.reshape(-1, len(vocab)), tokens[:, 1:].reshape(-1),
                                             reduction="none").view(2, -1)
    real = (tokens[:, 1:] != vocab.pad_id)
    real[:, 0] = False  # <bos> is given, not predicted
    w = weights[:, 1:] * real
    assert float(caption_loss(logits, tokens, vocab.pad_id, weights)) == pytest.approx(float((each * w).sum() / w.sum()))


@pytest.mark.parametrize("kind", ["nic", "transformer"])
def test_trimming_a_batch_to_its_longest_caption_leaves_the_loss_unchanged(vocab: CaptionVocab, kind: str) -> None:
    from models.captioner_training import trim_padding

    torch.manual_seed(5)
    model = build_captioner(kind, 8, vocab).eval()
    captions = ["a silly dog", "a lovely cat sleeps"]
    tokens = vocab.encode_batch(captions + CAPTIONS[:1], ["humor"] * 3)[:2]  # padded to a longer third caption
    weights = torch.rand(tokens.shape) + 0.5
    trimmed, trimmed_weights = trim_padding(tokens, weights, vocab.pad_id)
    assert trimmed.shape[1] == len(vocab.encode(captions[1], "humor")) < tokens.shape[1]
    assert (tokens[:, trimmed.shape[1]:] == vocab.pad_id).all()
    features = torch.randn(2, 1, 8)
    full = teacher_forcing_loss(model, features, tokens, vocab.pad_id, weights=weights)
    cut = teacher_forcing_loss(model, features, trimmed, vocab.pad_id, weights=trimmed_weights)
    assert cut.item() == pytest.approx(full.item(), rel=1e-5)


def test_weighting_inserted_words_makes_the_captioner_write_the_style_phrase(tmp_path: Path) -> None:
    """Three original pairs say "a dog runs on the grass", one augmented pair inserts "silly" into that caption: at
    weight 1 greedy decoding writes the majority caption; at weight 5 the inserted phrase outweighs it."""
    path = tmp_path / "pairs.parquet"
    plain, styled = "a dog runs on the grass", "a silly dog runs on the grass"
    pq.write_table(pa.table({"features": [[1.0, 0.0, 0.0, 0.0]] * 4, "style": ["humor"] * 4,
                             "caption": [plain] * 3 + [styled], "source_caption": [None] * 3 + [plain]}), path)
    written = {}
    for weight in (1.0, 5.0):
        out = tmp_path / f"w{weight:g}"
        summary = train_worker({"train_paths": [str(path)], "output_dir": str(out), "kind": "nic",
                                "hparams": {"embed_dim": 16, "hidden_dim": 24, "dropout": 0.0}, "epochs": 120,
                                "batch_size": 4, "lr": 0.02, "optimizer": "adam", "device": "cpu",
                                "source_column": "source_caption", "inserted_word_weight": weight})
        assert summary["inserted_words_weighted"] == (1 if weight != 1 else 0)
        written[weight] = greedy_decode(load_captioner(out), torch.tensor([[1.0, 0.0, 0.0, 0.0]]), "humor",
                                        max_len=10, no_repeat_ngram_size=0)[0]
    assert written == {1.0: plain, 5.0: styled}
    with pytest.raises(ValueError, match="inserted_word_weight 3 needs source_column"):
        train_worker({"train_paths": [str(path)], "output_dir": str(tmp_path / "x"), "inserted_word_weight": 3})
