"""Evaluation's visual re-ranking on Spark (jobs.visual_rerank): test pairs joined with the images' visual context in
the ``images`` table, beams decoded and re-ranked in the iterator pandas UDF, both rankings scored with the real
caption metrics and logged to MLflow. A tiny NIC fitted to write a known caption per image; MiniLM relatedness."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from models.captioners import CaptionVocab, beam_decode, save_captioner
from tests.test_captioners import CAPTIONS, STYLES, fitted

pytestmark = pytest.mark.spark


def test_rerank_beams_on_spark_scores_both_rankings(spark, fresh_cfg, tmp_path):
    from jobs.platform.spark import get_spark
    from jobs.platform.tables import TABLES, conform, table_name
    from jobs.platform.tracking import job_run
    from jobs.visual_rerank import rerank_beams, rerank_report
    from models.caption_metrics import CaptionScorer
    from models.caption_scoring import train_evaluation_classifiers

    cfg = fresh_cfg
    get_spark(cfg)
    vocab = CaptionVocab.build(CAPTIONS, STYLES, min_count=1)
    model, features = fitted("nic", vocab)
    path = save_captioner(model, tmp_path / "nic")
    classifiers = train_evaluation_classifiers("linear_probe", {"humor": ["a funny dog", "a silly cat laughing"]},
                                               ["a dog on grass", "a cat on a sofa"], device="cpu", max_length=32,
                                               name_or_path="all-MiniLM-L6-v2")
    classifiers_path = classifiers.save(tmp_path / "classifiers")
    # images i0 and i1 have visual context (i1 without a confidence: the plain cosine); i2 has none
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    images = pd.DataFrame({"image_id": ["i0", "i1", "i2"], "tags": ["sofa couch", "dog", None],
                           "tags_confidence": [0.3, None, None], "source": "test", "ingest_time": now})
    fields = TABLES["images"].schema.fields
    images = images.assign(**{f.name: None for f in fields if f.name not in images.columns})[[f.name for f in fields]]
    conform(spark.createDataFrame(images.astype(object).where(images.notna(), None), TABLES["images"].schema),
            "images").write.format("delta").mode("append").saveAsTable(table_name(cfg, "images"))
    pairs = spark.createDataFrame(pd.DataFrame({"image_id": ["i0", "i1", "i2"], "style": ["humor"] * 3,
                                                "features": [row.tolist() for row in features[:3]]}),
                                  "image_id string, style string, features array<float>")
    rows = rerank_beams(spark, cfg, pairs, {"original": {"path": str(path)}}, str(classifiers_path), None, 1)
    assert sorted(rows["image_id"].unique()) == ["i0", "i1"]  # only the images with visual context
    assert sorted(rows["ranking"]) == ["beam", "beam", "visual", "visual"]
    beams = beam_decode(model, features[:2], "humor", beam_size=cfg.evaluate.beam_size, max_len=cfg.evaluate.max_len,
                        no_repeat_ngram_size=0)
    for i, candidates in enumerate(beams):
        picked = rows[rows["image_id"] == f"i{i}"].set_index("ranking")
        assert picked.loc["beam", "hypothesis"] == candidates[0][0]
        assert picked.loc["visual", "relatedness"] >= picked.loc["beam", "relatedness"]
        assert 0 <= picked.loc["visual", "relatedness"] <= 1
        assert picked.loc["visual", "hypothesis"] in [c for c, _ in candidates]
    references = {("i0", "humor"): [CAPTIONS[0]], ("i1", "humor"): [CAPTIONS[1]]}
    with job_run(cfg, "evaluate") as run, CaptionScorer() as scorer:
        flat = rerank_report(rows, references, scorer)
    assert flat["rerank.images"] == 2 and flat["rerank.original.humor.images"] == 2
    assert flat["rerank.original.humor.beam.BLEU-1"] == pytest.approx(1.0, abs=1e-6)  # the fitted captions
    assert flat["rerank.original.humor.visual.relatedness"] >= flat["rerank.original.humor.beam.relatedness"]
    assert 0 <= flat["rerank.original.humor.changed"] <= 1
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)}
    assert {"visual_rerank.md", "visual_rerank.json"} <= artifacts
    table = Path(mlflow.MlflowClient().download_artifacts(run.info.run_id, "visual_rerank.md")).read_text()
    assert table.startswith("| variant | style | ranking | images | BLEU-1") and table.count("\n") == 4
    assert json.loads(Path(mlflow.MlflowClient().download_artifacts(run.info.run_id, "visual_rerank.json"))
                      .read_text())["columns"][:3] == ["variant", "style", "ranking"]
