"""Captioner training as TorchDistributor runs it: one process, and two gloo processes sharding one Parquet table.

The data is synthetic but learnable: four scenes (a prototype feature vector plus noise each), two styles, and the
caption is fixed by (scene, style), e.g. "a silly dog runs on the grass" / "a lovely dog runs on the grass".
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.multiprocessing as mp

from models.captioner_training import HOROVOD_INSTALL_HINT, TrainConfig, read_caption_parquet, train_worker, train_workers
from models.captioners import greedy_decode, load_captioner

torch.set_num_threads(1)

SCENES = ["dog runs on the grass", "man rides a bike down the street", "kid plays in the snow",
          "cat sleeps on a red sofa"]
STYLE_WORDS = {"humor": "a silly", "romantic": "a lovely"}
FEATURE_DIM = 16
REPEATS = 8  # rows per (scene, style): 4 x 2 x 8 = 64 rows
NIC = {"embed_dim": 32, "hidden_dim": 64}


def caption_of(scene: int, style: str) -> str:
    return f"{STYLE_WORDS[style]} {SCENES[scene]}"


@pytest.fixture(scope="module")
def prototypes() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(len(SCENES), FEATURE_DIM)).astype(np.float32)


@pytest.fixture(scope="module")
def train_file(tmp_path_factory: pytest.TempPathFactory, prototypes: np.ndarray) -> str:
    rng = np.random.default_rng(1)
    rows = [(prototypes[s] + 0.05 * rng.normal(size=FEATURE_DIM), style, caption_of(s, style))
            for _ in range(REPEATS) for s in range(len(SCENES)) for style in STYLE_WORDS]
    path = tmp_path_factory.mktemp("pairs") / "part-0.parquet"
    pq.write_table(pa.table({"features": [r[0].astype(np.float32).tolist() for r in rows],
                             "style": [r[1] for r in rows], "caption": [r[2] for r in rows]}), path)
    return str(path)


def config(train_file: str, output_dir: Path, **overrides) -> dict:
    return {"train_paths": [train_file], "output_dir": str(output_dir), "kind": "nic", "hparams": NIC,
            "epochs": 20, "batch_size": 16, "lr": 0.01, "device": "cpu", "log_every": 5, **overrides}


def test_single_process_nic_learns_every_training_caption(train_file: str, prototypes: np.ndarray,
                                                           tmp_path: Path) -> None:
    logged: list[tuple[int, dict]] = []
    result = train_worker(config(train_file, tmp_path / "nic"), on_step=lambda step, m: logged.append((step, m)))
    assert result["world_size"] == 1 and result["backend"] == "single"
    assert result["steps"] == 20 * 4 == len(result["losses"])
    assert result["rows_per_rank"] == [64] and result["shard_overlap"] == 0 and result["rows_covered"] == 64
    assert result["loss_first"] > 2.5  # ~ln(vocab) at the start
    assert result["loss_last"] < 0.1 * result["loss_first"]
    assert result["epoch_losses"][-1] < result["epoch_losses"][0]
    assert [step for step, _ in logged] == list(range(5, 81, 5))
    assert logged[-1][1]["loss"] == pytest.approx(result["loss_last"])

    model = load_captioner(tmp_path / "nic")
    features = torch.from_numpy(prototypes)
    for style in STYLE_WORDS:
        decoded = greedy_decode(model, features, style, max_len=12, no_repeat_ngram_size=0)
        assert decoded == [caption_of(s, style) for s in range(4)]


def test_single_process_transformer_over_regions(train_file: str, prototypes: np.ndarray, tmp_path: Path) -> None:
    hparams = {"d_model": 32, "nhead": 2, "num_layers": 1, "dim_feedforward": 64, "max_len": 16}
    result = train_worker(config(train_file, tmp_path / "tf", kind="transformer", hparams=hparams, lr=0.003,
                                 feature_regions=4))
    assert result["loss_last"] < 0.2 * result["loss_first"]
    saved = json.loads((tmp_path / "tf" / "captioner.json").read_text())
    assert saved["kind"] == "transformer" and saved["feature_dim"] == FEATURE_DIM // 4
    model = load_captioner(tmp_path / "tf")
    regions = torch.from_numpy(prototypes).reshape(4, 4, FEATURE_DIM // 4)
    decoded = greedy_decode(model, regions, ["humor", "romantic", "romantic", "humor"], max_len=12,
                            no_repeat_ngram_size=0)
    assert decoded == [caption_of(0, "humor"), caption_of(1, "romantic"), caption_of(2, "romantic"),
                       caption_of(3, "humor")]


def test_several_models_in_one_launch_report_each_epoch(train_file: str, tmp_path: Path, capsys) -> None:
    configs = [config(train_file, tmp_path / "humor-original", epochs=2),
               config(train_file, tmp_path / "model", epochs=2, label="humor-augmented")]
    results = train_workers(configs)
    assert [r["steps"] for r in results] == [8, 8]
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train ")]
    assert [line.split(" loss ")[0] for line in lines] == [
        "train 1/2 nic (humor-original): epoch 1/2", "train 1/2 nic (humor-original): epoch 2/2",
        "train 2/2 nic (humor-augmented): epoch 1/2", "train 2/2 nic (humor-augmented): epoch 2/2"]
    reported = [float(line.split(" loss ")[1].split()[0]) for line in lines]
    assert reported == pytest.approx([loss for r in results for loss in r["epoch_losses"]], abs=1e-3)


def _rank_main(rank: int, world_size: int, port: int, cfg: dict, result_dir: str) -> None:
    """One spawned worker, with the environment TorchDistributor gives it."""
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    result = train_worker(cfg)
    Path(result_dir, f"rank{rank}.json").write_text(json.dumps(result))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_gloo_processes_train_on_disjoint_shards(train_file: str, tmp_path: Path) -> None:
    cfg = config(train_file, tmp_path / "ddp", epochs=6)
    mp.spawn(_rank_main, args=(2, _free_port(), cfg, str(tmp_path)), nprocs=2, join=True)
    result = json.loads((tmp_path / "rank0.json").read_text())
    assert json.loads((tmp_path / "rank1.json").read_text()) is None
    assert result["world_size"] == 2 and result["backend"] == "ddp"
    assert result["rows_per_rank"] == [32, 32]
    assert result["shard_overlap"] == 0 and result["rows_covered"] == 64
    assert result["steps"] == 6 * 2  # 32 rows per rank in batches of 16
    assert result["loss_last"] < 0.7 * result["loss_first"]
    assert load_captioner(tmp_path / "ddp").vocab.styles == ("humor", "romantic")


def test_horovod_backend_names_how_to_install_it(train_file: str, tmp_path: Path) -> None:
    try:
        import horovod.torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("horovod is installed here; this checks the message shown where it is not")
    with pytest.raises(ImportError, match="pip install --no-build-isolation horovod") as info:
        train_worker(config(train_file, tmp_path / "hvd", backend="horovod"))
    assert str(info.value) == HOROVOD_INSTALL_HINT


def test_config_errors_name_the_key(train_file: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown training config keys \['epoch'\]"):
        TrainConfig.from_dict({**config(train_file, tmp_path), "epoch": 3})
    with pytest.raises(ValueError, match="needs \\['train_paths'\\]"):
        TrainConfig.from_dict({"output_dir": str(tmp_path)})
    with pytest.raises(ValueError, match="kind must be one of"):
        TrainConfig.from_dict(config(train_file, tmp_path, kind="sat"))
    with pytest.raises(ValueError, match="backend must be one of"):
        TrainConfig.from_dict(config(train_file, tmp_path, backend="mpi"))
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        TrainConfig.from_dict(config(train_file, tmp_path, batch_size=0))
    with pytest.raises(ValueError, match="lr must be a finite number > 0"):
        TrainConfig.from_dict(config(train_file, tmp_path, lr=-1.0))
    parsed = TrainConfig.from_dict(config(train_file, tmp_path))
    assert parsed.train_paths == (train_file,) and parsed.epochs == 20


def test_bad_training_data_is_refused(train_file: str, tmp_path: Path) -> None:
    data = read_caption_parquet([train_file])
    assert data.features.shape == (64, 1, FEATURE_DIM) and data.features.dtype == np.float32
    assert sorted(set(data.styles)) == ["humor", "romantic"] and data.captions[0] == caption_of(0, "humor")
    with pytest.raises(ValueError, match=r"lacks columns \['text'\]; it has \['features', 'style', 'caption'\]"):
        read_caption_parquet([train_file], caption_column="text")
    pq.write_table(pa.table({"features": [[1.0, 2.0], [1.0]], "style": ["humor", "humor"], "caption": ["a", "b"]}),
                   tmp_path / "ragged.parquet")
    with pytest.raises(ValueError, match="one non-zero length"):
        read_caption_parquet([str(tmp_path / "ragged.parquet")])
    pq.write_table(pa.table({"features": [[1.0], [2.0]], "style": ["humor", "humor"], "caption": ["a", None]}),
                   tmp_path / "nulls.parquet")
    with pytest.raises(ValueError, match="'caption' has 1 null values"):
        read_caption_parquet([str(tmp_path / "nulls.parquet")])
    pq.write_table(pa.table({"features": [[1.0], [2.0]], "style": ["humor", "humor"], "caption": [1, 2]}),
                   tmp_path / "ints.parquet")
    with pytest.raises(ValueError, match="'caption' must hold strings, got int64"):
        read_caption_parquet([str(tmp_path / "ints.parquet")])
    (tmp_path / "delta" / "_delta_log").mkdir(parents=True)
    with pytest.raises(ValueError, match="is a Delta table"):
        read_caption_parquet([str(tmp_path / "delta")])
    with pytest.raises(ValueError, match="does not exist"):
        read_caption_parquet([str(tmp_path / "missing.parquet")])
    with pytest.raises(ValueError, match="not divisible by feature_regions=3"):
        read_caption_parquet([train_file], feature_regions=3)
