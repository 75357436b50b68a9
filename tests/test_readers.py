"""Readers of the real formats: good rows parsed, malformed rows quarantined with a reason, nothing lost."""
from __future__ import annotations

import json
import pickle

import pytest

from readers.corpora import Reader, image_id_from_name, scene_id
from readers.errors import InputFileError
from tests.conftest import shared_data

STYLES = ["humor", "romantic", "positive", "negative"]


@pytest.fixture
def reader():
    return Reader(STYLES)


def test_image_ids():
    assert image_id_from_name("COCO_val2014_000000389081.jpg") == "coco:389081"
    assert image_id_from_name("2513260012_03d33305cf.jpg") == "flickr30k:2513260012"
    assert image_id_from_name("1000268201.jpg") == "flickr30k:1000268201"
    assert image_id_from_name("") is None and image_id_from_name("foo.jpg") is None
    assert scene_id("coco:1", "humor", "A dog .") == scene_id("coco:1", "humor", "a dog")


def test_senticap_json_good_and_bad(tmp_path, reader):
    data = {"images": [
        {"filename": "COCO_val2014_000000000042.jpg", "imgid": 0, "split": "test",
         "sentences": [{"raw": "a lovely dog .", "sentiment": 1}, {"raw": "a sad dog .", "sentiment": 0},
                       {"raw": "", "sentiment": 1}, {"raw": "a dog .", "sentiment": 7}]},
        {"filename": "", "imgid": 1, "split": "train", "sentences": [{"raw": "no image .", "sentiment": 0}]},
    ]}
    path = tmp_path / "senticap.json"
    path.write_text(json.dumps(data))
    res = reader.read("senticap_json", path)
    assert [(r["style"], r["split"], r["image_id"]) for r in res.stylized] == [
        ("positive", "test", "coco:42"), ("negative", "test", "coco:42")]
    reasons = sorted(q["reason"] for q in res.quarantine)
    assert reasons == ["empty caption", "missing image id",
                       "unknown style 7 (allowed: humor, romantic, positive, negative)"]
    assert len(res.stylized) + len(res.quarantine) == 5


def test_senticap_csv(tmp_path, reader):
    path = tmp_path / "senticap.csv"
    path.write_text("filename,is_positive_sentiment,caption\n"
                    "COCO_val2014_000000000042.jpg,1,a happy cat\n"
                    "COCO_val2014_000000000043.jpg,0,\n"
                    ",0,a gloomy cat\n")
    res = reader.read("senticap_csv", path, split="train")
    assert [(r["style"], r["caption"]) for r in res.stylized] == [("positive", "a happy cat")]
    assert sorted(q["reason"] for q in res.quarantine) == ["empty caption", "missing image id"]


def test_flickrstyle_lines_encoding_and_names(tmp_path, reader):
    names = tmp_path / "names.p"
    with names.open("wb") as fh:
        pickle.dump(["1_aa.jpg", "2_bb.jpg", "3_cc.jpg"], fh, protocol=0)
    text = tmp_path / "funny_train.txt"
    text.write_bytes(b"a dog chasing a bone .\r\na caf\xe9 cat .\r\n  \r\na fourth line without image .\r\n")
    # 4 caption lines for 3 image names: an error naming both files and both counts...
    with pytest.raises(InputFileError, match=r"funny_train.txt has 4 lines but .*names.p has 3") as info:
        reader.read("flickrstyle", text, style="humor", image_names=str(names), split="train")
    assert "on_misaligned: quarantine" in info.value.fix
    # ... unless the source quarantines the unpaired lines
    res = reader.read("flickrstyle", text, style="humor", image_names=str(names), split="train",
                      on_misaligned="quarantine")
    assert [(r["image_id"], r["caption"]) for r in res.stylized] == [("flickr30k:1", "a dog chasing a bone .")]
    reasons = sorted(q["reason"].split(" (")[0] for q in res.quarantine)
    assert reasons == ["bad encoding", "empty caption", "unpaired line"]
    assert "funny_train.txt has 4 lines, names.p has 3" in res.quarantine[-1]["reason"]
    assert res.read == 4 == len(res.stylized) + len(res.quarantine)
    latin = reader.read("flickrstyle", text, style="humor", image_names=str(names), encoding="latin-1",
                        on_misaligned="quarantine")
    assert [r["caption"] for r in latin.stylized] == ["a dog chasing a bone .", "a café cat ."]


def test_flickr30k_tokens(tmp_path, reader):
    path = tmp_path / "results.token"
    path.write_text("1000268201.jpg#0\tA child in a pink dress .\n"
                    "1000268201.jpg#1\t\n"
                    "no tab here\n"
                    "1000268202.jpg#0\tA dog runs .\n")
    res = reader.read("flickr30k_tokens", path)
    assert [r["caption_id"] for r in res.factual] == ["flickr30k:1000268201.jpg#0", "flickr30k:1000268202.jpg#0"]
    assert sorted(q["reason"].split(" (")[0] for q in res.quarantine) == ["empty caption", "malformed line"]
    assert {q["line_no"] for q in res.quarantine} == {2, 3}


def test_coco_captions(tmp_path, reader):
    path = tmp_path / "captions.json"
    path.write_text(json.dumps({"images": [{"id": 42, "file_name": "COCO_val2014_000000000042.jpg"}],
                                "annotations": [{"id": 1, "image_id": 42, "caption": "A man rides a horse."},
                                                {"id": 2, "image_id": None, "caption": "orphan"},
                                                {"id": 3, "image_id": 42, "caption": "   "}]}))
    res = reader.read("coco_captions", path, image_root="/imgs")
    assert [(r["caption_id"], r["image_uri"]) for r in res.factual] == [
        ("coco:1", "/imgs/COCO_val2014_000000000042.jpg")]
    assert sorted(q["reason"] for q in res.quarantine) == ["empty caption", "missing image id"]
    with pytest.raises(ValueError, match="not an MSCOCO captions json"):
        bad = tmp_path / "bad.json"
        bad.write_text("{}")
        reader.read("coco_captions", bad)


def test_unknown_format(reader, tmp_path):
    with pytest.raises(ValueError, match="unknown ingest format"):
        reader.read("parquet_magic", tmp_path)


def test_real_senticap():
    res = Reader(STYLES).read("senticap_json", shared_data("senticap", "senticap.json"))
    styles = [r["style"] for r in res.stylized]
    assert len(res.stylized) + len(res.quarantine) == 8869
    assert styles.count("positive") + styles.count("negative") == len(styles)
    assert styles.count("positive") >= 4800 and styles.count("negative") >= 3900


def test_real_flickrstyle_romantic_latin1():
    folder = shared_data("flickrstyle10k")
    reader = Reader(STYLES)
    as_utf8 = reader.read("flickrstyle", folder / "romantic_train.txt", style="romantic",
                          image_names=str(folder / "train_ro.p"))
    assert as_utf8.quarantine and all(q["reason"].startswith("bad encoding") for q in as_utf8.quarantine)
    as_latin1 = reader.read("flickrstyle", folder / "romantic_train.txt", style="romantic", encoding="latin-1",
                            image_names=str(folder / "image_names_romantic.txt"))
    assert len(as_latin1.stylized) == 7000 and not as_latin1.quarantine
    humor = reader.read("flickrstyle", folder / "funny_train.txt", style="humor",
                        image_names=str(folder / "image_names_humor.txt"))
    assert len(humor.stylized) == 7000
    # humor and romantic describe the same images in the same order
    assert [r["image_id"] for r in humor.stylized] == [r["image_id"] for r in as_latin1.stylized]
    factual = reader.read("flickr30k_tokens", folder / "factual_train.txt")
    assert len(factual.factual) == 35000
    assert {r["image_id"] for r in humor.stylized} == {r["image_id"] for r in factual.factual}


def test_real_karpathy_refs_with_visual_context():
    res = Reader(STYLES).read("coco_karpathy_refs", shared_data("coco_karpathy_test"))
    assert len(res.factual) == 25000 and len({r["image_id"] for r in res.factual}) == 5000
    images = res.frames()["images"]
    assert len(images) == 5000
    assert images.set_index("image_id").loc["coco:42", "tags"] == "standard poodle shopping cart footwear"
    # the label classifier's confidence rides beside the labels (textual_visual_context/visual-context.txt)
    confidence = images.set_index("image_id")["tags_confidence"]
    assert confidence["coco:42"] == pytest.approx(0.1427611233) and confidence["coco:359"] == pytest.approx(0.306412897)
    assert confidence.notna().all() and confidence.between(0, 1 / 3 + 1e-6).all()  # mean of 3 softmax probabilities


def test_karpathy_tag_confidences_and_a_bad_one_quarantined(tmp_path, reader):
    folder = tmp_path / "karpathy"
    folder.mkdir()
    (folder / "image_ID.txt").write_text("".join(f"COCO_val2014_{40 + i:012d}.jpg\t{40 + i}\n" for i in range(3)))
    (folder / "karpathy-refs-1.txt").write_text("a dog on grass\na cat on a sofa\na man on a bike\n")
    (folder / "visual-context_label.txt").write_text("dog lawn\ntabby couch\nbicycle person\n")
    (folder / "visual-context.txt").write_text("0.25\nlots\n0.3\n")
    res = reader.read("coco_karpathy_refs", folder)
    images = res.frames()["images"].set_index("image_id")
    assert images.loc["coco:40", "tags_confidence"] == 0.25 and images.loc["coco:42", "tags_confidence"] == 0.3
    assert images.loc["coco:41", "tags"] == "tabby couch" and images["tags_confidence"].isna().sum() == 1
    assert [(q["line_no"], q["reason"]) for q in res.quarantine] == [
        (2, "bad visual context confidence (not a number in [0, 1])")]
    assert res.counts()["unaccounted"] == 0
    (folder / "visual-context.txt").write_text("0.25\n0.2\n")  # one line short: an error naming both files
    with pytest.raises(InputFileError, match="visual-context.txt has 2 lines but .*image_ID.txt has 3"):
        reader.read("coco_karpathy_refs", folder)
    (folder / "visual-context.txt").unlink()  # no confidences: labels alone
    assert reader.read("coco_karpathy_refs", folder).frames()["images"]["tags_confidence"].isna().all()


def test_manifest_tag_confidence(tmp_path, reader):
    path = tmp_path / "images.jsonl"
    path.write_text(json.dumps({"image_id": "a", "tags": "dog", "tags_confidence": 0.4}) + "\n"
                    + json.dumps({"image_id": "b", "tags": "cat", "tags_confidence": 1.5}) + "\n"
                    + json.dumps({"image_id": "c", "tags": "cow"}) + "\n")
    res = reader.read("image_manifest", path)
    assert [(r["image_id"], r["tags_confidence"]) for r in res.images] == [("a", 0.4), ("c", None)]
    assert res.quarantine[0]["reason"] == "malformed record (wrong type: tags_confidence)"
