"""The paper's protocol at ingest (pandas, no Spark): splits by image, duplicates counted, P without the stylized
images (their factual captions become scene descriptions); and the same on the real corpora in ../shared/data."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from jobs.ingest import read_sources
from jobs.platform.config import IngestSource, load_config
from readers.corpora import flickrstyle_splits, senticap_splits
from tests.conftest import shared_data


def test_flickrstyle_split_counts_are_the_papers_and_deterministic():
    ids = [f"flickr30k:{i}" for i in range(7000)]
    split = flickrstyle_splits(ids, seed=2021)
    assert pd.Series(split).value_counts().to_dict() == {"train": 5400, "val": 600, "test": 1000}
    assert flickrstyle_splits(list(reversed(ids)), seed=2021) == split  # input order does not matter
    assert flickrstyle_splits(ids, seed=7) != split  # the seed does
    small = pd.Series(flickrstyle_splits(ids[:70], seed=2021)).value_counts().to_dict()
    assert small == {"train": 54, "val": 6, "test": 10}  # a small set: test capped at a seventh


def test_senticap_keeps_test_and_moves_images_per_polarity_to_val():
    rows = []
    for i in range(60):
        official = "test" if i < 10 else "val" if i < 20 else "train"
        for style in ("positive", "negative") if i % 3 else ("positive",):
            rows.append({"image_id": f"coco:{i}", "style": style, "split": official})
    split = senticap_splits(pd.DataFrame(rows), seed=1, val_images_per_style=5)
    assert {i for i, s in split.items() if s == "test"} == {f"coco:{i}" for i in range(10)}
    val = [i for i, s in split.items() if s == "val"]
    assert len(val) == 10 and pd.Series(split).value_counts()["train"] == 40  # official val joined train
    frame = pd.DataFrame(rows)
    for style in ("positive", "negative"):
        assert frame[(frame["style"] == style) & frame["image_id"].isin(val)]["image_id"].nunique() >= 5
    assert senticap_splits(pd.DataFrame(rows), seed=1, val_images_per_style=5) == split
    kept = senticap_splits(pd.DataFrame(rows), seed=1, val_images_per_style=0)
    assert pd.Series(kept).value_counts().to_dict() == {"train": 40, "test": 10, "val": 10}


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """70 FlickrStyle images (humor + romantic) with 2 Flickr30K captions each, 10 more Flickr30K images; SentiCap
    on 30 COCO images (one duplicated sentence), and COCO captions on 10 of those and 20 others."""
    monkeypatch.setenv("ERG_HOME", str(tmp_path))
    names = [f"{1000 + i}_ab.jpg" for i in range(70)]
    (tmp_path / "names.txt").write_text("\n".join(names) + "\n")
    (tmp_path / "funny.txt").write_text("\n".join(f"a dog number {i} chasing a bone ." for i in range(70)) + "\n")
    (tmp_path / "romantic.txt").write_text("\n".join(f"a dog number {i} in love ." for i in range(70)) + "\n")
    tokens = [f"{1000 + i}.jpg#{k}\ta dog number {i} runs , take {k} ." for i in range(80) for k in range(2)]
    (tmp_path / "results.token").write_text("\n".join(tokens) + "\n")
    images = []
    for i in range(30):
        official = "test" if i < 5 else "val" if i < 10 else "train"
        sentences = [{"raw": f"a lovely cat {i} .", "sentiment": 1}, {"raw": f"a sad cat {i} .", "sentiment": 0}]
        if i == 12:
            sentences.append({"raw": "A lovely cat 12", "sentiment": 1})  # the same caption once normalised
        images.append({"filename": f"COCO_val2014_{i:012d}.jpg", "imgid": i, "split": official,
                       "sentences": sentences})
    (tmp_path / "senticap.json").write_text(json.dumps({"images": images}))
    coco_ids = list(range(20, 30)) + list(range(100, 120))
    (tmp_path / "coco.json").write_text(json.dumps({
        "images": [{"id": i, "file_name": f"COCO_train2014_{i:012d}.jpg"} for i in coco_ids],
        "annotations": [{"id": n, "image_id": i, "caption": f"a cat on a mat {n}"} for n, i in enumerate(coco_ids)]}))
    cfg = load_config("test", ["ingest.splits.senticap_val_images_per_style=2"])
    sources = [
        IngestSource(format="senticap_json", path=str(tmp_path / "senticap.json")),
        IngestSource(format="flickrstyle", style="humor", path=str(tmp_path / "funny.txt"),
                     image_names=str(tmp_path / "names.txt")),
        IngestSource(format="flickrstyle", style="romantic", path=str(tmp_path / "romantic.txt"),
                     image_names=str(tmp_path / "names.txt")),
        IngestSource(format="flickr30k_tokens", path=str(tmp_path / "results.token")),
        IngestSource(format="coco_captions", path=str(tmp_path / "coco.json")),
    ]
    return cfg, sources


def test_splits_by_image_on_synthetic_corpora(corpus):
    cfg, sources = corpus
    result, _ = read_sources(cfg, sources)
    stylized = result.frames()["stylized_captions"]
    assert stylized["split"].notna().all()
    assert (stylized.groupby("image_id")["split"].nunique() == 1).all()  # humor + romantic: one split per image
    per_image = stylized.drop_duplicates("image_id")
    flickr = per_image[per_image["source"] == "flickrstyle10k"]["split"].value_counts().to_dict()
    assert flickr == {"train": 54, "val": 6, "test": 10}
    senti = per_image[per_image["source"] == "senticap"]
    assert senti["split"].value_counts().to_dict() == {"train": 21, "test": 5, "val": 4}
    assert set(senti[senti["split"] == "test"]["image_id"]) == {f"coco:{i}" for i in range(5)}
    again, _ = read_sources(cfg, sources)  # deterministic
    assert again.frames()["stylized_captions"]["split"].tolist() == stylized["split"].tolist()


def test_factual_corpus_excludes_stylized_images_and_duplicates_are_counted(corpus):
    cfg, sources = corpus
    result, per_source = read_sources(cfg, sources)
    frames = result.frames()
    stylized_images = set(frames["stylized_captions"]["image_id"])
    factual = frames["factual_captions"]
    assert not set(factual["image_id"]) & stylized_images
    assert len(factual) == 10 * 2 + 20  # the 10 Flickr30K images without style, the 20 COCO images without SentiCap
    # the stylized images' factual captions are their scene descriptions, on their images rows
    assert len(result.descriptions) == 70 * 2 + 10
    images = frames["images"].set_index("image_id")
    assert images.loc["flickr30k:1003", "descriptions"] == ["a dog number 3 runs , take 0 .",
                                                            "a dog number 3 runs , take 1 ."]
    assert images.loc["coco:25", "descriptions"] == ["a cat on a mat 5"]
    assert pd.isna(images.loc["coco:100", "descriptions"])
    # the duplicated SentiCap sentence is counted, not silently collapsed; every row read is accounted for
    senti = per_source["senticap_json:senticap.json"]
    assert senti["stylized_duplicates"] == 1 and senti["stylized"] == 60 and senti["read"] == 61
    for counts in per_source.values():
        assert counts["read"] == counts["kept"] + counts["quarantined"] + counts["duplicates"]
        assert counts["kept"] == counts["stylized"] + counts["factual"] + counts["descriptions"]
        assert counts["unaccounted"] == 0
    assert per_source["flickr30k_tokens:results.token"]["descriptions"] == 140
    assert per_source["coco_captions:coco.json"]["descriptions"] == 10


def test_known_stylized_images_from_an_earlier_ingest_stay_out_of_p(corpus):
    cfg, sources = corpus
    result, _ = read_sources(cfg, sources[-1:], known_stylized_images={"coco:100"})
    assert "coco:100" not in set(result.frames()["factual_captions"]["image_id"])
    assert [d["image_id"] for d in result.descriptions] == ["coco:100"]


def test_real_corpora_follow_the_papers_protocol():
    shared_data("flickrstyle10k", "funny_train.txt")
    shared_data("senticap", "senticap.json")
    shared_data("coco_karpathy_test", "image_ID.txt")
    cfg = load_config("conf/shared_data.yaml")
    result, per_source = read_sources(cfg, cfg.ingest.sources)
    frames = result.frames()
    per_image = frames["stylized_captions"].drop_duplicates("image_id")
    assert (frames["stylized_captions"].groupby("image_id")["split"].nunique() == 1).all()
    flickr = per_image[per_image["source"] == "flickrstyle10k"]["split"].value_counts().to_dict()
    assert flickr == {"train": 5400, "val": 600, "test": 1000}
    senti = per_image[per_image["source"] == "senticap"]["split"].value_counts().to_dict()
    assert senti["val"] == 200 and senti["test"] == 743  # SentiCap's own test images (878 entries, 743 images)
    senticap_images = set(per_image[per_image["source"] == "senticap"]["image_id"])
    factual = frames["factual_captions"]
    assert not set(factual["image_id"]) & senticap_images and len(factual) == 25000 - 930
    assert set(factual["source"]) == {"coco_karpathy"}  # FlickrStyle's Flickr30K captions are not P
    assert per_source["flickr30k_tokens:factual_train.txt"]["descriptions"] == 35000
    assert per_source["senticap_json:senticap.json"]["stylized_duplicates"] == 226
    assert sum(c["read"] for c in per_source.values()) == 8869 + 14000 + 35000 + 25000
