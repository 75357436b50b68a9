"""The generated sample: deterministic from its seed, in the real formats, with planted bad rows."""
from __future__ import annotations

import hashlib
from pathlib import Path

from jobs.ingest import read_sources
from jobs.platform.config import load_config
from jobs.sample import PLANTED_BAD_ROWS, sample_sources, write_sample


def _digest(folder: Path) -> str:
    h = hashlib.sha1()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            h.update(path.relative_to(folder).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def test_sample_is_deterministic_and_readable(tmp_path, monkeypatch):
    monkeypatch.setenv("ERG_HOME", str(tmp_path))
    cfg_a = load_config("test", [f"sample.dir={tmp_path / 'a'}"])
    cfg_b = load_config("test", [f"sample.dir={tmp_path / 'b'}"])
    write_sample(cfg_a)
    write_sample(cfg_b)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    cfg_c = load_config("test", [f"sample.dir={tmp_path / 'c'}", "sample.seed=8"])
    write_sample(cfg_c)
    assert _digest(tmp_path / "c") != _digest(tmp_path / "a")

    result, _ = read_sources(cfg_a, sample_sources(cfg_a))
    frames = result.frames()
    styles = frames["stylized_captions"]["style"].value_counts().to_dict()
    n = cfg_a.sample.stylized_per_style
    # planted: an empty and an undecodable humor line replace good ones; the bad SentiCap rows are extra
    assert styles == {"positive": n, "negative": n, "romantic": n, "humor": n - 2}
    assert len(frames["quarantine"]) == sum(PLANTED_BAD_ROWS.values())
    # P excludes the stylized images: their factual captions are their scene descriptions
    assert len(frames["factual_captions"]) + len(result.descriptions) == cfg_a.sample.factual_captions
    assert not set(frames["stylized_captions"]["image_id"]) & set(frames["factual_captions"]["image_id"])
    assert len(frames["factual_captions"]) > 0
    assert len(frames["images"]) == cfg_a.sample.n_images
    assert frames["images"]["tags"].notna().all()
    # scenes are shared: every stylized caption's image has scene descriptions
    described = set(frames["images"].dropna(subset=["descriptions"])["image_id"])
    assert set(frames["stylized_captions"]["image_id"]) == described


def test_splits_follow_the_image(tmp_path, monkeypatch):
    import pandas as pd

    from jobs.ingest import assign_splits

    frame = pd.DataFrame({"image_id": [f"img{i}" for i in range(2000)] * 2, "split": [None] * 3999 + ["val"]})
    out = assign_splits(frame, {"train": 0.8, "val": 0.1, "test": 0.1})
    assert out["split"].iloc[-1] == "val"  # a given split is kept
    shares = out["split"].iloc[:2000].value_counts(normalize=True)
    assert 0.75 < shares["train"] < 0.85 and 0.07 < shares["test"] < 0.13
    # the same image gets the same split wherever it appears
    assert (out["split"].iloc[:1999].values == out["split"].iloc[2000:3999].values).all()
