"""What `erg train` can and cannot run on the pinned stack (pyspark 4.2, pyarrow >= 18, torch 2.13).

- petastorm (0.12.1 / 0.13.1) does not import: it needs ``pyarrow.filesystem``, which pyarrow >= 18 removed. The
  tests record that exact failure (skipped where petastorm is not installed; CI installs it with
  ``pip install --no-deps petastorm==0.13.1 diskcache==5.6.3 future==1.0.0``) and that ``train.reader: petastorm``
  falls back to the Spark Parquet snapshot with a warning and the reason.
- Mosaic Streaming (``train.reader: mds``, the loader Databricks recommends): the snapshot is written as MDS shards
  by ``streaming``'s Spark converter and two TorchDistributor processes each read their own partition through a
  ``StreamingDataset`` (skipped where mosaicml-streaming is not installed; CI installs it ``--no-deps``).
- Horovod: without it, ``train.backend: horovod`` is an ImportError naming ``scripts/install_horovod.sh``; where it
  is installed (that script, or a Databricks ML runtime), two Gloo processes under ``horovod.spark.run`` train a
  captioner and the loss falls.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

PETASTORM = importlib.util.find_spec("petastorm") is not None
STREAMING = importlib.util.find_spec("streaming") is not None
HOROVOD = importlib.util.find_spec("horovod") is not None and importlib.util.find_spec("horovod.torch") is not None
FEATURE_DIM = 8
SCENES = ["dog runs on the grass", "man rides a bike", "kid plays in the snow", "cat sleeps on a sofa"]
STYLE_WORDS = {"humor": "a silly", "romantic": "a lovely"}


def _pairs(repeats: int = 6) -> list[tuple[list[float], str, str]]:
    """Learnable pairs: a noisy prototype vector per scene; the caption is fixed by (scene, style)."""
    rng = np.random.default_rng(0)
    prototypes = rng.normal(size=(len(SCENES), FEATURE_DIM))
    return [((prototypes[s] + 0.05 * rng.normal(size=FEATURE_DIM)).astype(np.float32).tolist(), style,
             f"{words} {SCENES[s]}")
            for _ in range(repeats) for s in range(len(SCENES)) for style, words in STYLE_WORDS.items()]


def _with_sources(rows: list[tuple[list[float], str, str]]) -> list[tuple[list[float], str, str, str]]:
    """``rows`` with the snapshot's ``source_caption``: the first 4 humor pairs are augmented ("silly" inserted into
    a factual caption, 4 inserted words in all), the rest original ("")."""
    return [(*row, row[2].replace("a silly ", "a ") if i < 8 and row[1] == "humor" else "")
            for i, row in enumerate(rows)]


@pytest.mark.skipif(not PETASTORM, reason="petastorm is not installed (pip install --no-deps petastorm==0.13.1 "
                                          "diskcache==5.6.3 future==1.0.0 records its failure)")
def test_petastorm_does_not_import_with_pyarrow_18_or_newer() -> None:
    assert int(pa.__version__.split(".")[0]) >= 18
    with pytest.raises(ModuleNotFoundError, match=r"^No module named 'pyarrow\.filesystem'$") as caught:
        import petastorm  # noqa: F401
    assert caught.value.name == "pyarrow.filesystem"


@pytest.mark.spark
@pytest.mark.skipif(not PETASTORM, reason="petastorm is not installed: the fallback path needs its import to fail")
def test_petastorm_reader_falls_back_to_spark_parquet(spark, tmp_path: Path) -> None:
    from jobs.train import write_snapshot
    from models.captioner_training import read_caption_parquet

    rows = _pairs(repeats=2)
    frame = spark.createDataFrame(rows, "features array<float>, style string, caption string")
    with pytest.warns(RuntimeWarning, match=r"train.reader=petastorm cannot run here .*pyarrow\.filesystem"):
        files, fallback = write_snapshot(spark, frame, tmp_path, "petastorm")
    assert fallback == "ModuleNotFoundError: No module named 'pyarrow.filesystem'"
    assert files and all(Path(f).parent == tmp_path / "parquet" and f.endswith(".parquet") for f in files)
    data = read_caption_parquet(files)
    assert data.features.shape == (len(rows), 1, FEATURE_DIM)
    assert sorted(data.captions) == sorted(r[2] for r in rows)


def test_snapshot_reader_must_be_known(tmp_path: Path) -> None:
    from jobs.train import write_snapshot

    with pytest.raises(ValueError, match=r"reader must be one of \['parquet', 'mds', 'petastorm'\], got 'delta'"):
        write_snapshot(None, None, tmp_path, "delta")


@pytest.mark.spark
@pytest.mark.skipif(not STREAMING, reason="mosaicml-streaming is not installed (pip install --no-deps "
                                          "mosaicml-streaming==0.13.0; its other requirements are in the test extra)")
def test_mds_snapshot_is_read_by_streaming_dataset_in_two_torch_distributor_processes(spark, tmp_path: Path) -> None:
    import torch
    from streaming import StreamingDataset

    from jobs.platform.config import load_config
    from jobs.train import run_distributed, worker_config, write_snapshot
    from models.captioners import greedy_decode, load_captioner

    rows = _with_sources(_pairs())  # 48 rows
    frame = spark.createDataFrame(rows, "features array<float>, style string, caption string, "
                                        "source_caption string").repartition(3)
    paths, fallback = write_snapshot(spark, frame, tmp_path / "data", "mds")
    assert fallback is None and paths == [str(tmp_path / "data" / "mds")]
    index = json.loads((tmp_path / "data" / "mds" / "index.json").read_text())
    assert sum(shard["samples"] for shard in index["shards"]) == len(rows)
    whole = StreamingDataset(local=paths[0], shuffle=False, batch_size=8)
    assert len(whole) == len(rows) and sorted(s["caption"] for s in whole) == sorted(r[2] for r in rows)
    assert len({int(s["row_index"]) for s in whole}) == len(rows)

    torch.manual_seed(0)
    cfg = load_config("test", [f"home={tmp_path}", "train.reader=mds", "train.num_processes=2", "train.epochs=6",
                               "train.batch_size=8", "train.lr=0.01", "train.hparams={embed_dim: 16, hidden_dim: 32}"])
    config = worker_config(cfg, paths, tmp_path / "model")
    assert config["train_format"] == "mds"
    summary = run_distributed(cfg, config)
    assert summary["backend"] == "ddp" and summary["world_size"] == 2
    assert summary["rows"] == len(rows) and summary["rows_per_rank"] == [24, 24]
    assert summary["shard_overlap"] == 0 and summary["rows_covered"] == len(rows)  # each rank its own partition
    assert summary["loss_last"] < 0.7 * summary["loss_first"]
    assert summary["inserted_words_weighted"] == 4  # summed over the two ranks' partitions
    model = load_captioner(tmp_path / "model")
    assert model.vocab.styles == ("humor", "romantic")
    assert len(greedy_decode(model, torch.zeros(2, FEATURE_DIM), "humor", max_len=8, no_repeat_ngram_size=0)) == 2


def _horovod_setup(tmp_path: Path) -> tuple:
    from jobs.platform.config import load_config
    from jobs.train import worker_config

    path = tmp_path / "pairs.parquet"
    rows = _with_sources(_pairs())
    pq.write_table(pa.table({"features": [r[0] for r in rows], "style": [r[1] for r in rows],
                             "caption": [r[2] for r in rows], "source_caption": [r[3] for r in rows]}), path)
    cfg = load_config("test", [f"home={tmp_path}", "train.backend=horovod", "train.num_processes=2",
                               "train.epochs=6", "train.batch_size=8", "train.lr=0.01",
                               "train.hparams={embed_dim: 16, hidden_dim: 32}"])
    return cfg, worker_config(cfg, [str(path)], tmp_path / "model")


@pytest.mark.skipif(HOROVOD, reason="horovod is installed here: the training test below covers the backend")
def test_horovod_backend_without_horovod_names_the_install_script(tmp_path: Path) -> None:
    from jobs.train import run_distributed

    cfg, config = _horovod_setup(tmp_path)
    assert config["backend"] == "horovod"
    with pytest.raises(ImportError, match=r"scripts/install_horovod\.sh.*train\.backend=torch_distributor"):
        run_distributed(cfg, config)


@pytest.mark.spark
@pytest.mark.skipif(not HOROVOD, reason="horovod is not installed: build it with scripts/install_horovod.sh "
                                        "(horovod 0.28.1 from source, 490-590 s on 2 cores)")
def test_horovod_spark_run_trains_two_gloo_processes(spark, tmp_path: Path) -> None:
    import torch

    from jobs.train import run_distributed
    from models.captioners import greedy_decode, load_captioner

    torch.manual_seed(0)
    cfg, config = _horovod_setup(tmp_path)
    summary = run_distributed(cfg, config)
    assert summary["backend"] == "horovod" and summary["world_size"] == 2
    assert summary["rows_per_rank"] == [24, 24] and summary["shard_overlap"] == 0
    assert summary["loss_last"] < 0.7 * summary["loss_first"]
    assert summary["inserted_words_weighted"] == 4
    model = load_captioner(tmp_path / "model")
    assert model.vocab.styles == ("humor", "romantic")
    assert len(greedy_decode(model, torch.zeros(2, FEATURE_DIM), "humor", max_len=8, no_repeat_ngram_size=0)) == 2


@pytest.mark.spark
def test_the_training_snapshot_has_one_row_order_whatever_the_partitions(spark, tmp_path: Path) -> None:
    """The workers shuffle with a seeded sampler over the rows in the order they read them: the same pairs must
    reach them in the same order from any home, however Spark's partitions (shuffles, joins) held them."""
    from jobs.platform.config import load_config
    from jobs.train import snapshot_config
    from models.captioner_training import read_caption_parquet

    rows = [(feat, 1, style, caption, "original" if i % 3 else "augmented", f"p{i:03d}", f"img{i % 7}", "")
            for i, (feat, style, caption) in enumerate(_pairs(repeats=4))]
    ddl = ("features array<float>, n_regions int, style string, caption string, origin string, pair_id string, "
           "image_id string, source_caption string")
    cfg = load_config("test", [f"home={tmp_path}"])
    orders = []
    for name, frame in (("a", spark.createDataFrame(rows, ddl).repartition(3)),
                        ("b", spark.createDataFrame(rows[::-1], ddl).repartition(5, "caption"))):
        config, n_files, _ = snapshot_config(spark, cfg, frame, tmp_path / name, 1)
        assert n_files >= 1
        data = read_caption_parquet(config["train_paths"])
        orders.append((list(data.captions), data.features[:, 0, 0].tolist()))
    expected = sorted(rows, key=lambda r: r[5])
    assert orders[0] == orders[1]
    assert orders[0][0] == [r[3] for r in expected]
