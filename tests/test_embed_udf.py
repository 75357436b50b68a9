"""The embed UDF's partition function on pandas frames (no Spark): length-sorted windows pad less, and keep every
row's vector and the input order."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pandas as pd

from models.encoders import load_encoder
from udfs.embedding import LENGTH_BUCKET_BATCHES, EncoderSpec, embed_partitions


def _padding(batches: list[list[int]]) -> int:
    return sum(max(b) * len(b) - sum(b) for b in batches)


def test_embed_partitions_sorts_windows_by_length_and_keeps_input_order(monkeypatch) -> None:
    rng = np.random.default_rng(3)
    words = "a dog man woman runs on the beach with ball red blue happily under sky near water".split()
    texts = [" ".join(rng.choice(words, size=int(n))) for n in rng.integers(2, 30, size=150)]
    spec = EncoderSpec.of("sentence", None, "cpu", batch_size=8)
    encoder = spec.load("cpu")  # the instance the UDF gets from the process cache
    embed_texts, seen = encoder._embed_texts, []

    def recording(batch: list[str]):
        seen.append([len(t) for t in batch])
        return embed_texts(batch)

    monkeypatch.setattr(encoder, "_embed_texts", recording)
    frames = [pd.DataFrame({"item_id": [f"f{i}" for i in range(a, b)], "item_kind": "factual", "modality": "text",
                            "text": texts[a:b], "tags": None, "uri": None, "region_features": None})
              for a, b in ((0, 50), (50, 120), (120, 150))]
    out = pd.concat(list(embed_partitions(spec)(iter(frames))), ignore_index=True)
    assert out["item_id"].tolist() == [f"f{i}" for i in range(150)]
    assert out["skip_reason"].isna().all()
    # a window of 16 batches of 8 (128 captions), longest first, then the other 22
    assert len(seen) == LENGTH_BUCKET_BATCHES + 3
    first_window = [n for batch in seen[:LENGTH_BUCKET_BATCHES] for n in batch]
    assert first_window == sorted((len(t) for t in texts[:128]), reverse=True)
    in_input_order = [[len(t) for t in texts[i:i + 8]] for i in range(0, 150, 8)]
    assert _padding(seen) < 0.3 * _padding(in_input_order)
    reference = load_encoder("sentence", device="cpu").encode_texts(texts, batch_size=1)
    np.testing.assert_allclose(np.stack(out["vector"].to_numpy()), reference, atol=2e-5)
