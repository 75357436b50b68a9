"""ERG step 4 on Spark: ``erg train`` (TorchDistributor, two gloo processes on CPU) and ``erg evaluate`` (Table 2).

One module-scoped setup, in a home and schema of its own. The generated sample is read through the ingest readers
and its splits assigned as ``erg ingest`` does, and its images are embedded from their tags with the pretrained
MiniLM through ``udfs.embedding.embed_batch`` (the vectors ``erg embed`` writes); the rows are appended to the
tables directly, because the ingest and embed jobs (MERGE per table, tested in their own modules) would cost
minutes on this loaded 2-core machine. A few passing augmented captions are planted (and one whose image has no
vector, which training must count, not lose); linear-probe evaluation classifiers (one per style, vs factual
captions) and per-style trigram LMs become the current ones (what ``erg extract`` / ``erg generate`` leave). Then both captioner variants train
with ``num_processes=2`` and are evaluated.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import importlib.util
import json
import os
from pathlib import Path

import pytest
from planted_tables import append_rows, set_current_scoring

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytestmark = [pytest.mark.spark, pytest.mark.slow]

STYLES = ["humor", "positive"]  # one FlickrStyle10K and one SentiCap style of the sample
PETASTORM = importlib.util.find_spec("petastorm") is not None
NIC = "{embed_dim: 32, hidden_dim: 64}"


def _load_sample(spark, cfg) -> tuple:
    """The sample's stylized captions and image vectors in the tables; returns (factual captions, encoder)."""
    from jobs.ingest import assign_splits, read_sources
    from jobs.sample import sample_sources, write_sample
    from jobs.vocabulary import encoder_spec
    from udfs.embedding import embed_batch, encoder_identity

    write_sample(cfg)
    frames = read_sources(cfg, sample_sources(cfg))[0].frames()
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    stylized = assign_splits(frames["stylized_captions"], cfg.ingest.split_fractions)
    append_rows(spark, cfg, "stylized_captions", stylized.assign(ingest_time=now, run_id="fixture"))
    spec = encoder_spec(cfg)
    identity = encoder_identity(spec)
    images = frames["images"]
    items = images.assign(item_id=images["image_id"], item_kind="image", modality="image", text=None,
                          region_features=None)
    vectors = embed_batch(spec.load("cpu"), items, batch_size=64)
    vectors = vectors[vectors["skip_reason"].isna()].drop(columns="skip_reason")
    append_rows(spark, cfg, "embeddings", vectors.assign(encoder=identity.name, encoder_version=identity.version,
                                                     run_id="fixture", created_at=now))
    factual = assign_splits(frames["factual_captions"], cfg.ingest.split_fractions)
    return stylized, factual, identity.version


def _plant_augmented(spark, cfg, stylized, factual) -> int:
    """Passing augmented pairs: factual images outside val/test captioned with a train caption of each style; plus
    one on an image with no embedding. Returns how many have an image vector."""
    held_out = set(stylized.loc[stylized["split"] != "train", "image_id"])
    chosen = factual[~factual["image_id"].isin(held_out)].sort_values("caption_id").head(12)
    train = stylized[stylized["split"] == "train"].sort_values("scene_id")
    styles = [STYLES[i % len(STYLES)] for i in range(len(chosen))]
    captions = [train.loc[train["style"] == style, "caption"].iloc[i % 3] for i, style in enumerate(styles)]
    # the phrase of an augmented pair comes from a train scene (training_set keeps out any other)
    scenes = [train.loc[train["style"] == style, "scene_id"].iloc[i % 3] for i, style in enumerate(styles)]
    planted = chosen.assign(query_id=chosen["caption_id"], factual_caption=chosen["caption"], style=styles,
                            generated_caption=captions, scene_id=scenes)[["query_id", "image_id", "factual_caption",
                                                                          "style", "generated_caption", "scene_id"]]
    planted.loc[len(planted)] = ["q-missing", "img:no-vector", "a dog on the grass", "humor", captions[0], scenes[0]]
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    append_rows(spark, cfg, "augmented_captions", planted.assign(
        retrieval_type="t2t", style_phrase="planted", similarity=0.9,
        passed_style=True, passed_perplexity=True, passed_similarity=True, passed=True,
        generator_version="planted", run_id="planted", created_at=now))
    return len(chosen)


@pytest.fixture(scope="module")
def trained(spark, erg_home) -> dict:
    from jobs.evaluate import evaluate
    from jobs.platform.config import load_config
    from jobs.platform.spark import get_spark
    from jobs.platform.tables import table_name
    from jobs.train import train

    home = erg_home / "train_evaluate"
    base = [f"home={home}", "tables.schema=t_train_evaluate", f"sample.dir={home / 'sample'}",
            f"styles=[{', '.join(STYLES)}]", "sample.stylized_per_style=20", "train.num_processes=2",
            "train.epochs=4", "train.batch_size=8", "train.lr=0.01", f"train.hparams={NIC}",
            "train.features=retrieval_embeddings",  # the retrieval encoder's image vectors (test_experiment_spark
            # covers the default, the textual visual context)
            "evaluate.max_images=4", "evaluate.split=val", "evaluate.samples_to_log=2"]  # val: 2 images per style
    cfg = load_config("test", base)
    get_spark(cfg)
    stylized, factual, encoder_version = _load_sample(spark, cfg)
    planted = _plant_augmented(spark, cfg, stylized, factual)
    set_current_scoring(cfg, stylized, factual, STYLES, "fixture")
    original_cfg = load_config("test", base + ["train.use_augmented=false",
                                               f"train.reader={'petastorm' if PETASTORM else 'parquet'}"])
    with pytest.warns(RuntimeWarning, match="petastorm") if PETASTORM else contextlib.nullcontext():
        original = train(spark, original_cfg)
    augmented = train(spark, cfg)
    evaluated = evaluate(spark, cfg)
    return {"cfg": cfg, "original": original, "augmented": augmented, "evaluated": evaluated, "planted": planted,
            "encoder_version": encoder_version, "name": lambda table: table_name(cfg, table)}


def _client(cfg):
    import mlflow

    mlflow.set_tracking_uri(cfg.mlflow.tracking_uri)
    return mlflow.tracking.MlflowClient()


def test_two_process_training_lowers_the_loss_and_counts_every_pair(spark, trained: dict) -> None:
    name = trained["name"]
    n_train = spark.sql(f"SELECT count(*) AS n FROM {name('stylized_captions')} WHERE split = 'train' "
                        f"AND style IN ({', '.join(repr(s) for s in STYLES)})").first().n
    original, augmented = trained["original"], trained["augmented"]
    for result in (original, augmented):
        assert result["world_size"] == 2 and result["backend"] == "ddp"
        assert result["loss_last"] < result["loss_first"]
        assert result["steps"] == len(result["losses"]) > 4
        assert result["rows.original"] == n_train and result["rows_without_vector.original"] == 0
        assert Path(result["model_path"], "model.safetensors").is_file()
        assert result["encoder_version"] == trained["encoder_version"]
    assert original["variant"] == "original" and augmented["variant"] == "augmented"
    assert original["rows.augmented"] == 0 and original["rows_without_vector.augmented"] == 0
    assert augmented["rows.augmented"] == trained["planted"]
    assert augmented["rows_without_vector.augmented"] == 1  # the planted pair whose image has no vector
    assert augmented["rows"] == n_train + trained["planted"]
    assert original["styles"] == augmented["styles"] == sorted(STYLES)


def test_training_runs_are_logged_with_variant_losses_and_model(trained: dict) -> None:
    from jobs.platform.model_store import get_current

    cfg = trained["cfg"]
    client = _client(cfg)
    for variant in ("original", "augmented"):
        result = trained[variant]
        run = client.get_run(result["run_id"])
        assert run.data.tags["erg.captioner_variant"] == variant and run.data.tags["erg.job"] == "train"
        history = client.get_metric_history(result["run_id"], "loss")
        assert [m.step for m in history] == list(range(1, result["steps"] + 1))
        assert history[-1].value == pytest.approx(result["loss_last"])
        assert run.data.metrics[f"rows.{variant}"] == result[f"rows.{variant}"]
        assert run.data.params["train.use_augmented"] == str(variant == "augmented")
        artifacts = {f.path for f in client.list_artifacts(result["run_id"], "captioner")}
        assert {"captioner/model.safetensors", "captioner/vocab.json", "captioner/captioner.json",
                "captioner/train_summary.json"} <= artifacts
        current = get_current(cfg, f"captioner_{variant}")
        assert current["version"] == result["run_id"] and current["path"] == result["model_path"]
    original_tags = client.get_run(trained["original"]["run_id"]).data.tags
    if PETASTORM:  # petastorm cannot import with pyarrow >= 18: the job fell back to Spark Parquet
        assert original_tags["erg.reader"] == "parquet"
        assert "pyarrow.filesystem" in original_tags["erg.reader_fallback"]
        assert "pyarrow.filesystem" in trained["original"]["reader_fallback"]
    else:
        assert "erg.reader_fallback" not in original_tags


def test_evaluate_scores_both_variants_per_style_in_table2(trained: dict) -> None:
    evaluated = trained["evaluated"]
    metrics = evaluated["metrics"]
    assert set(metrics) == {"original", "augmented"}
    assert list(metrics["original"]) == list(metrics["augmented"])
    assert list(metrics["original"]) == STYLES
    for style, scores in metrics["original"].items():
        assert trained["evaluated"]["counts"][f"pairs.{style}"] <= 4  # evaluate.max_images
        for by_style in (metrics["original"], metrics["augmented"]):
            values = by_style[style]
            assert set(values) == {"BLEU-1", "BLEU-3", "METEOR", "CIDEr", "cls.", "ppl."}
            for metric in ("BLEU-1", "BLEU-3", "METEOR", "cls."):
                assert 0.0 <= values[metric] <= 1.0
            assert 0.0 <= values["CIDEr"] <= 10.0
            assert values["ppl."] >= 1.0
            assert values["BLEU-3"] <= values["BLEU-1"] + 1e-9
    lines = evaluated["table2"].strip().splitlines()
    assert lines[0] == "| style | run | BLEU-1 | BLEU-3 | METEOR | CIDEr | cls. | ppl. |"
    assert len(lines) == 2 + 3 * len(metrics["original"])
    assert evaluated["captioner_runs"] == {"original": trained["original"]["run_id"],
                                          "augmented": trained["augmented"]["run_id"]}


def test_evaluation_of_both_training_runs_is_comparable_in_mlflow(trained: dict) -> None:
    cfg, evaluated = trained["cfg"], trained["evaluated"]
    client = _client(cfg)
    experiment = client.get_experiment_by_name(cfg.mlflow.experiment)
    runs = client.search_runs([experiment.experiment_id], "tags.`erg.job` = 'evaluate'")
    assert [r.info.run_id for r in runs] == [evaluated["run_id"]]
    run = runs[0]
    assert run.data.tags["erg.captioner_run.original"] == trained["original"]["run_id"]
    assert run.data.tags["erg.captioner_run.augmented"] == trained["augmented"]["run_id"]
    for style, scores in evaluated["metrics"]["original"].items():
        after = evaluated["metrics"]["augmented"][style]
        for metric, value in scores.items():
            assert run.data.metrics[f"original.{style}.{metric}"] == pytest.approx(value)
            assert run.data.metrics[f"augmented.{style}.{metric}"] == pytest.approx(after[metric])
            assert run.data.metrics[f"delta.{style}.{metric}"] == pytest.approx(after[metric] - value)
    artifacts = {f.path for f in client.list_artifacts(evaluated["run_id"])}
    assert {"table2.md", "table2.html", "table2.json", "caption_samples.json"} <= artifacts
    local = Path(client.download_artifacts(evaluated["run_id"], "table2.md"))
    assert local.read_text() == evaluated["table2"]
    samples = json.loads(Path(client.download_artifacts(evaluated["run_id"], "caption_samples.json")).read_text())
    assert set(samples["columns"]) >= {"variant", "style", "hypothesis", "references", "predicted_style"}


def test_evaluate_and_train_refuse_bad_input(trained: dict, tmp_path: Path) -> None:
    from jobs.evaluate import style_scores, trained_captioners
    from jobs.platform.config import load_config
    from jobs.platform.model_store import set_current
    from jobs.train import check_hparams
    from jobs.vocabulary import captioner_kind

    empty = load_config("test", [f"home={tmp_path}"])
    with pytest.raises(ValueError, match="no trained captioner"):
        trained_captioners(empty)
    set_current(empty, "captioner_original", {"encoder_version": "a", "styles": ["humor"]})
    set_current(empty, "captioner_augmented", {"encoder_version": "b", "styles": ["humor"]})
    with pytest.raises(ValueError, match="different image encoders"):
        trained_captioners(empty)
    with pytest.raises(ValueError, match="captioner variant must be one of"):
        captioner_kind("mixed")
    with pytest.raises(ValueError, match=r"unknown keys \['d_model'\].*allowed: \['dropout', 'embed_dim'"):
        check_hparams(load_config("test", ["train.hparams={d_model: 8}"]))
    with pytest.raises(ValueError, match="'median' or 'mean'"):
        style_scores(None, {}, None, "mode")
