"""conf/databricks.yaml runs: loaded as a user would, with only what this machine cannot have swapped, the pipeline
goes from the raw files on the "Volumes" through generate.

Swapped here, and nothing else: the Databricks runtime (platform local, this session), Unity Catalog (the local
catalog, a schema of its own), the workspace MLflow and UC registry (a sqlite store), the hub checkpoints
(bert-base-uncased, openai/clip-vit-base-patch32, gpt2 -> tiny models of the same classes saved in a folder, loaded
by path through the same code) and ``/Volumes/`` (a temp folder holding the generated sample in the real file
formats, laid out as the conf names them, with the image files under the conf's image roots for CLIP). Faiss on GPU
stays asked for: with faiss-cpu it falls back to CPU and counts it.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import mlflow
import pytest

from tiny_models import save_tiny_bert, save_tiny_clip

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[1]
RAW = "Volumes/main/erg/raw"


def _volumes(root: Path, sample: Path) -> None:
    """The sample's files where conf/databricks.yaml reads them (ERG_CATALOG=main, ERG_SCHEMA=erg)."""
    raw = root / RAW
    copies = {"senticap/senticap.json": "senticap/senticap.json",
              "flickrstyle10k/funny_train.txt": "flickrstyle10k/funny_train.txt",
              "flickrstyle10k/image_names_humor.txt": "flickrstyle10k/image_names_humor.txt",
              "flickrstyle10k/romantic_train.txt": "flickrstyle10k/romantic_train.txt",
              "flickrstyle10k/image_names_romantic.txt": "flickrstyle10k/image_names_romantic.txt",
              "flickrstyle10k/factual_train.txt": "flickr30k/results_20130124.token",
              "coco/captions_sample.json": "coco/captions_train2014.json"}
    for source, target in copies.items():
        (raw / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(sample / source, raw / target)
    for images in ("coco/val2014", "coco/train2014", "flickr30k/flickr30k-images"):
        shutil.copytree(sample / "images", raw / images)


@pytest.fixture(scope="module")
def databricks_run(spark, tmp_path_factory):
    from jobs.pipeline import run_pipeline
    from jobs.platform.config import load_config
    from jobs.platform.spark import get_spark
    from jobs.sample import write_sample
    from models.generator import create_generator_from_config

    root = tmp_path_factory.mktemp("databricks")
    sample_cfg = load_config("test", [f"sample.dir={root / 'sample'}", "sample.bad_rows=false"])
    write_sample(sample_cfg)
    _volumes(root, root / "sample")
    conf = root / "databricks_here.yaml"
    conf.write_text((REPO / "conf" / "databricks.yaml").read_text().replace("/Volumes/", f"{root}/Volumes/"))
    as_shipped = load_config("databricks")

    corpus = [line.split("\t", 1)[1] for line in (root / "sample/flickrstyle10k/factual_train.txt").read_text()
              .splitlines() if "\t" in line]
    bert, clip = save_tiny_bert(root / "bert-base-uncased"), save_tiny_clip(root / "clip-vit-base-patch32")
    gpt2 = create_generator_from_config("causal", corpus, root / "gpt2", vocab_size=400,
                                        config_overrides={"n_layer": 1, "n_embd": 32, "n_head": 2,
                                                          "n_positions": 96}, seed=0)
    cfg = load_config(str(conf), [
        "platform=local", "tables.catalog=null", "tables.schema=t_databricks_conf",
        f"mlflow.tracking_uri=sqlite:///{root}/mlflow.db", "mlflow.registry_uri=null",
        f"mlflow.artifact_location={root}/mlartifacts",
        f"extract.classifier.name_or_path={bert}", f"extract.evaluation.name_or_path={bert}",
        f"embed.encoder.name_or_path={clip}", f"generate.generator.name_or_path={gpt2}",
    ])
    get_spark(cfg)
    return as_shipped, cfg, run_pipeline(spark, cfg)


def test_the_shipped_conf_has_an_image_source_and_no_toy_cap(databricks_run) -> None:
    as_shipped, _, _ = databricks_run
    assert as_shipped.embed.encoder.kind == "clip"
    assert all(s.image_root and s.image_root.startswith("/Volumes/main/erg/raw/") for s in as_shipped.ingest.sources)
    caps = {"generate.max_candidates": as_shipped.generate.max_candidates,
            "generate.max_candidates_per_style": as_shipped.generate.max_candidates_per_style,
            "extract.head_selection_captions": as_shipped.extract.head_selection_captions,
            "extract.classifier.max_train_captions": as_shipped.extract.classifier.max_train_captions,
            "extract.evaluation.max_train_captions": as_shipped.extract.evaluation.max_train_captions,
            "spark.shuffle_partitions": as_shipped.spark.shuffle_partitions}
    assert caps == dict.fromkeys(caps), caps


def test_the_databricks_conf_runs_through_generate_on_clip_pixels(spark, databricks_run) -> None:
    from jobs.platform.tables import table_name

    _, cfg, result = databricks_run
    images = spark.table(table_name(cfg, "images")).filter("uri is not null").collect()
    assert images and all(f"/{RAW}/" in r.uri and Path(r.uri).is_file() for r in images)
    vectors = spark.table(table_name(cfg, "embeddings")).filter("modality = 'image'")
    assert vectors.count() == len(images)  # every image file's pixels went through CLIP
    assert {len(r.vector) for r in vectors.select("vector").limit(5).collect()} == {16}
    assert spark.table(table_name(cfg, "retrievals")).count() > 0
    generated = result["generate"]
    assert generated["candidates"] > 0 and generated["augmented_captions.inserted"] == generated["candidates"]
    retrieve_run = mlflow.get_run(result["retrieve"]["run_id"])
    assert retrieve_run.data.metrics["index.faiss_gpu_fallback"] == 1  # use_gpu asked, faiss-cpu here: counted
