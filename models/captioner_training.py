"""Distributed captioner training: the function Spark's TorchDistributor (or Horovod) runs on every worker.

:func:`train_worker` is a plain, picklable function with no Spark import. Each worker process

1. reads the training pairs (columns: style, caption, image feature vector as ``list<float>``) from Parquet files
   (``train_format="parquet"``: every rank reads all rows) or from a Mosaic Streaming (MDS) dataset
   (``train_format="mds"``: each rank reads its own partition through ``streaming.StreamingDataset``);
2. joins the process group that the launcher described in the environment (``RANK``, ``WORLD_SIZE``,
   ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``, as TorchDistributor and torchrun set them; gloo on CPU, nccl on
   GPU), or runs alone when ``WORLD_SIZE`` is absent or 1; with ``backend="horovod"`` it calls ``hvd.init()``;
3. takes its shard of the rows (Parquet: through ``DistributedSampler``; MDS: the partition StreamingDataset gave
   it, cut to the smallest rank's size so every rank takes the same number of steps; ``rows_covered`` in the summary
   shows any row so left out) and trains the captioner wrapped in DDP (or with Horovod's ``DistributedOptimizer``)
   with Adam (the paper's recipe) or AdamW, optionally with scheduled sampling (the probability of feeding the
   model's own sample back instead of the gold word rises with the epochs);
4. reports every ``log_every`` steps to an optional ``on_step(step, metrics)`` callback (rank 0 only) and, after
   each epoch, one progress line on rank 0's stderr (which TorchDistributor and Horovod relay to the driver's
   output): model i/n, epoch, mean loss, seconds; saves the model and its vocabulary from rank 0 to ``output_dir``
   and returns the loss curve from rank 0 (None elsewhere).

Every rank builds the same vocabulary from all rows (Parquet: it read them; MDS: the ranks exchange their captions,
ordered by the snapshot's row index).

Images with different numbers of regions (e.g. the textual visual context: a few texts per image) are stored padded
to ``feature_regions`` regions, with the count of real ones in ``regions_column``; the padding is masked out.
"""
from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from models.backbones import pick_device
from models.captioners import (CAPTIONER_KINDS, Captioner, CaptionVocab, build_captioner, caption_loss,
                               save_captioner, teacher_forcing_loss)

BACKENDS = ("ddp", "horovod")
TRAIN_FORMATS = ("parquet", "mds")
OPTIMIZERS = ("adam", "adamw")
SCHEDULE_KEYS = ("start", "increase", "every_epochs", "max")


def sampling_probability(schedule: dict[str, Any] | None, epoch: int) -> float:
    """Scheduled sampling's probability in ``epoch`` (0-based): ``min(max, start + increase * (epoch //
    every_epochs))``; the paper's recipe is start 0, increase 0.05 every 5 epochs. None: 0 (teacher forcing)."""
    if schedule is None:
        return 0.0
    if not isinstance(schedule, dict) or set(schedule) != set(SCHEDULE_KEYS):
        raise ValueError(f"scheduled_sampling must be a dict with keys {list(SCHEDULE_KEYS)}, got {schedule!r}")
    every = schedule["every_epochs"]
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"scheduled_sampling.every_epochs must be a positive integer, got {every!r}")
    for key in ("start", "increase", "max"):
        value = schedule[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError(f"scheduled_sampling.{key} must be a number in [0, 1], got {value!r}")
    return float(min(schedule["max"], schedule["start"] + schedule["increase"] * (epoch // every)))


def trim_padding(tokens: torch.Tensor, weights: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens`` and ``weights`` cut to the batch's longest caption: the columns that are padding in every row go.
    The loss is the same (padding is never a target, and no real position sees a later one), the work is not:
    captions are padded to the longest of the whole data set, a batch's longest is usually much shorter."""
    length = int((tokens != pad_id).sum(dim=1).max())  # every row has its style prefix and <eos>: never 0
    return tokens[:, :length], weights[:, :length]


def scheduled_sampling_loss(model: nn.Module, features: torch.Tensor, tokens: torch.Tensor, pad_id: int,
                            probability: float, region_padding_mask: torch.Tensor | None = None,
                            generator: torch.Generator | None = None, weights: torch.Tensor | None = None
                            ) -> torch.Tensor:
    """Cross-entropy of the caption words when each input word is, with ``probability``, replaced by a word
    sampled from the model's own prediction at that position (two passes, as for transformers in Mihaylova and
    Martins 2019: a pass without gradients samples the words, a second pass learns from the mixed input).

    The style token and ``<bos>`` are always given; ``probability`` 0 is :func:`teacher_forcing_loss`.
    ``weights`` (shaped like ``tokens``) weight each predicted position, as in :func:`caption_loss`.
    """
    if probability <= 0:
        return teacher_forcing_loss(model, features, tokens, pad_id, region_padding_mask, weights)
    inputs = tokens[:, :-1]
    with torch.no_grad():
        logits = model(features, inputs, region_padding_mask)
        probs = torch.softmax(logits.float(), dim=-1)
        sampled = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).view(inputs.shape)
    mixed = inputs.clone()
    # input position t >= 2 is a word; the model's guess for it is its prediction at position t - 1
    draw = torch.rand(inputs[:, 2:].shape, device=inputs.device, generator=generator) < probability
    replace = draw & (inputs[:, 2:] != pad_id)
    mixed[:, 2:] = torch.where(replace, sampled[:, 1:-1], inputs[:, 2:])
    return caption_loss(model(features, mixed, region_padding_mask), tokens, pad_id, weights)
HOROVOD_INSTALL_HINT = (
    "backend 'horovod' needs Horovod built with PyTorch support, e.g. "
    "HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 "
    "pip install --no-build-isolation horovod==0.28.1 (on Databricks ML runtimes it is preinstalled); "
    "or use backend 'ddp' with Spark's TorchDistributor"
)

OnStep = Callable[[int, dict[str, float]], None]


@dataclass(frozen=True)
class TrainConfig:
    """What :func:`train_worker` reads from its ``config`` dict; unknown keys and bad values are ValueErrors."""

    train_paths: tuple[str, ...]
    output_dir: str
    kind: str = "nic"
    hparams: dict[str, Any] = field(default_factory=dict)
    feature_column: str = "features"
    style_column: str = "style"
    caption_column: str = "caption"
    # the factual caption an augmented pair was generated from (null or empty for original pairs): the words the
    # caption adds to it (its inserted style phrase) weigh ``inserted_word_weight`` in the loss; 1 = plain mean
    source_column: str | None = None
    inserted_word_weight: float = 1.0
    feature_regions: int = 1
    regions_column: str | None = None
    train_format: str = "parquet"  # parquet: files or folders of them; mds: one MDS dataset folder (index.json)
    index_column: str = "row_index"  # mds: a unique integer per row, for the vocabulary's order and shard checks
    vocab_path: str | None = None
    min_count: int = 1
    max_words: int = 30
    epochs: int = 5
    batch_size: int = 32
    lr: float = 1e-3
    optimizer: str = "adamw"
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 23
    device: str = "auto"
    backend: str = "ddp"
    log_every: int = 10
    scheduled_sampling: dict[str, Any] | None = None
    label: str | None = None  # what the progress lines call this model (default: the output folder's name)

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> TrainConfig:
        """Validate ``config``: a ValueError names the key, the value given and what is allowed."""
        if not isinstance(config, dict):
            raise ValueError(f"config must be a dict, got {type(config).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"unknown training config keys {unknown}; allowed: {sorted(known)}")
        missing = [k for k in ("train_paths", "output_dir") if not config.get(k)]
        if missing:
            raise ValueError(f"training config needs {missing}: the Parquet files to train on and where to save")
        paths = config["train_paths"]
        paths = (paths,) if isinstance(paths, (str, os.PathLike)) else tuple(paths)
        values = {**config, "train_paths": tuple(str(p) for p in paths), "output_dir": str(config["output_dir"])}
        parsed = cls(**values)
        parsed._check()
        return parsed

    def _check(self) -> None:
        if self.kind not in CAPTIONER_KINDS:
            raise ValueError(f"kind must be one of {list(CAPTIONER_KINDS)}, got {self.kind!r}")
        if not isinstance(self.hparams, dict):
            raise ValueError(f"hparams must be a dict of captioner hyper-parameters, got {self.hparams!r}")
        if self.train_format not in TRAIN_FORMATS:
            raise ValueError(f"train_format must be one of {list(TRAIN_FORMATS)}, got {self.train_format!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.scheduled_sampling is not None:
            sampling_probability(self.scheduled_sampling, 0)
        for name in ("feature_regions", "min_count", "max_words", "epochs", "batch_size", "log_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.inserted_word_weight != 1 and not self.source_column:
            raise ValueError(f"inserted_word_weight {self.inserted_word_weight} needs source_column: the column of "
                             "the factual caption each augmented caption was generated from")
        for name, low in (("lr", None), ("inserted_word_weight", None), ("weight_decay", 0.0), ("grad_clip", 0.0)):
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or (value <= 0 if low is None else value < low):
                raise ValueError(f"{name} must be a finite number {'> 0' if low is None else '>= 0 (0 = off)'}, "
                                 f"got {value!r}")


@dataclass
class CaptionData:
    """Training pairs as arrays: features ``[N, regions, d]`` (float32), styles and captions; ``n_regions`` the
    real regions per row (the rest is padding) when the data has a regions column, else None (all real)."""

    features: np.ndarray
    styles: list[str]
    captions: list[str]
    n_regions: np.ndarray | None = None
    sources: list[str | None] | None = None  # each caption's factual source (None: an original pair)

    def padding_mask(self) -> np.ndarray | None:
        """``[N, regions]`` bool, True where a region is padding; None when every region is real."""
        if self.n_regions is None:
            return None
        return np.arange(self.features.shape[1])[None, :] >= self.n_regions[:, None]


def read_caption_parquet(paths: tuple[str, ...] | list[str], feature_column: str = "features",
                         style_column: str = "style", caption_column: str = "caption",
                         feature_regions: int = 1, regions_column: str | None = None,
                         source_column: str | None = None) -> CaptionData:
    """Read training pairs from Parquet files or folders of them.

    A Delta table folder is refused (its folder holds files of old versions): pass the current snapshot's files,
    e.g. ``spark.read.format("delta").load(path).inputFiles()``. A feature vector of length ``regions * d`` is
    reshaped to ``[regions, d]``. ``regions_column`` (integer, 1..regions) counts the real regions of a row.
    """
    if not paths:
        raise ValueError("no Parquet paths given to read training pairs from")
    for path in paths:
        if not Path(path).exists():
            raise ValueError(f"training data path {path} does not exist")
        if (Path(path) / "_delta_log").is_dir():
            raise ValueError(f"{path} is a Delta table: pass its current files (DataFrame.inputFiles()), "
                             "not the folder, which also holds files of older versions")
    dataset = pads.dataset(list(paths), format="parquet")
    columns = ([feature_column, style_column, caption_column] + ([regions_column] if regions_column else [])
               + ([source_column] if source_column else []))
    absent = [c for c in columns if c not in dataset.schema.names]
    if absent:
        raise ValueError(f"training data lacks columns {absent}; it has {dataset.schema.names}")
    table = dataset.to_table(columns=columns)
    if table.num_rows == 0:
        raise ValueError(f"training data in {list(paths)} has no rows")
    return caption_data(table, feature_column, style_column, caption_column, feature_regions, regions_column,
                        source_column)


def read_caption_mds(path: str, rank: int, world_size: int, local_rank: int, local_world_size: int,
                     feature_column: str = "features", style_column: str = "style", caption_column: str = "caption",
                     feature_regions: int = 1, regions_column: str | None = None, index_column: str = "row_index",
                     batch_size: int = 64, source_column: str | None = None) -> tuple[CaptionData, np.ndarray]:
    """This rank's partition of the MDS dataset in ``path`` (written by ``streaming``'s ``dataframe_to_mds`` or an
    ``MDSWriter``), read through ``streaming.StreamingDataset``; returns it and its rows' ``index_column`` values.

    StreamingDataset divides the samples among ``world_size`` ranks (padding the last ones by repeating samples, so
    the partitions are equally long); it reads the ranks from the environment, which this sets from the arguments
    (Horovod does not set ``RANK`` / ``WORLD_SIZE``).
    """
    from streaming import StreamingDataset

    if not (Path(path) / "index.json").is_file():
        raise ValueError(f"{path} is not an MDS dataset (no index.json): write the snapshot with train.reader=mds")
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(local_rank),
                       "LOCAL_WORLD_SIZE": str(local_world_size)})
    dataset = StreamingDataset(local=str(path), shuffle=False, batch_size=batch_size)
    columns = ([feature_column, style_column, caption_column] + ([regions_column] if regions_column else [])
               + ([source_column] if source_column else []))
    samples = list(dataset)
    if not samples:
        raise ValueError(f"rank {rank} got no rows of the MDS dataset in {path}")
    absent = [c for c in columns + [index_column] if c not in samples[0]]
    if absent:
        raise ValueError(f"training data in {path} lacks columns {absent}; it has {sorted(samples[0])}")
    table = pa.table({
        feature_column: pa.array([np.asarray(s[feature_column], dtype=np.float32).ravel() for s in samples],
                                 type=pa.list_(pa.float32())),
        style_column: pa.array([s[style_column] for s in samples], type=pa.string()),
        caption_column: pa.array([s[caption_column] for s in samples], type=pa.string()),
        **({regions_column: pa.array([int(s[regions_column]) for s in samples], type=pa.int64())}
           if regions_column else {}),
        **({source_column: pa.array([s[source_column] for s in samples], type=pa.string())} if source_column else {}),
    })
    data = caption_data(table, feature_column, style_column, caption_column, feature_regions, regions_column,
                        source_column)
    return data, np.asarray([int(s[index_column]) for s in samples], dtype=np.int64)


def caption_data(table: pa.Table, feature_column: str, style_column: str, caption_column: str,
                 feature_regions: int = 1, regions_column: str | None = None, source_column: str | None = None
                 ) -> CaptionData:
    """Check the training pairs in ``table`` (no nulls, string styles and captions, finite vectors of one length
    divisible by ``feature_regions``, real-region counts in range; ``source_column`` strings, null or empty for an
    original pair) and return them as arrays."""
    columns = [feature_column, style_column, caption_column] + ([regions_column] if regions_column else [])
    for name in columns:
        nulls = table.column(name).null_count
        if nulls:
            raise ValueError(f"column {name!r} has {nulls} null values; filter or quarantine them before training")
    for name in (style_column, caption_column) + ((source_column,) if source_column else ()):
        kind = table.schema.field(name).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise ValueError(f"column {name!r} must hold strings, got {kind}")
    vectors = table.column(feature_column).combine_chunks()
    if not (pa.types.is_list(vectors.type) or pa.types.is_large_list(vectors.type)
            or pa.types.is_fixed_size_list(vectors.type)):
        raise ValueError(f"column {feature_column!r} must be list<float> (one image feature vector), "
                         f"got {vectors.type}")
    lengths = np.asarray(pc.list_value_length(vectors))
    if lengths.min() != lengths.max() or lengths[0] == 0:
        raise ValueError(f"feature vectors in {feature_column!r} must all have one non-zero length, got lengths "
                         f"{sorted(set(lengths.tolist()))[:5]}")
    dim = int(lengths[0])
    if dim % feature_regions:
        raise ValueError(f"feature length {dim} is not divisible by feature_regions={feature_regions}")
    flat = np.asarray(vectors.flatten(), dtype=np.float32)
    if not np.isfinite(flat).all():
        raise ValueError(f"column {feature_column!r} holds NaN or infinite values")
    n_regions = None
    if regions_column:
        n_regions = np.asarray(table.column(regions_column).to_pylist(), dtype=np.int64)
        if n_regions.min() < 1 or n_regions.max() > feature_regions:
            raise ValueError(f"column {regions_column!r} must count 1..{feature_regions} real regions per row, got "
                             f"values from {int(n_regions.min())} to {int(n_regions.max())}")
    return CaptionData(features=flat.reshape(table.num_rows, feature_regions, dim // feature_regions),
                       styles=table.column(style_column).to_pylist(), captions=table.column(caption_column).to_pylist(),
                       n_regions=n_regions,
                       sources=table.column(source_column).to_pylist() if source_column else None)


class _Collective:
    """One process alone: no process group, no communication."""

    rank, world_size, local_rank = 0, 1, 0
    name = "single"

    def wrap(self, model: Captioner, optimizer: torch.optim.Optimizer,
             device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The module to call forward on and the optimizer to step."""
        return model, optimizer

    def step(self, optimizer: torch.optim.Optimizer, model: Captioner, grad_clip: float) -> None:
        """Clip the (already averaged) gradients and step."""
        if grad_clip:
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()

    def mean(self, value: float, device: torch.device) -> float:
        """Mean of ``value`` over all ranks."""
        return value

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` of every rank, in rank order."""
        return [obj]

    def finish(self) -> None:
        """Wait for every rank at the end of a successful training (not on an error, where a peer may never come)."""

    def close(self) -> None:
        """Leave the process group if this worker created it."""


class _TorchDDP(_Collective):
    """torch.distributed from the environment; DDP averages gradients."""

    name = "ddp"

    def __init__(self, device: torch.device) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.created = not dist.is_initialized()
        if self.created:
            missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
            if missing:
                raise ValueError(f"WORLD_SIZE={os.environ['WORLD_SIZE']} but {missing} are not set: run under "
                                 "TorchDistributor or torchrun, which set RANK, MASTER_ADDR and MASTER_PORT")
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", init_method="env://")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))

    def wrap(self, model: Captioner, optimizer: torch.optim.Optimizer,
             device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        return ddp, optimizer

    def mean(self, value: float, device: torch.device) -> float:
        tensor = torch.tensor([value], dtype=torch.float64, device=device)
        self.dist.all_reduce(tensor)
        return float(tensor.item()) / self.world_size

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        self.dist.all_gather_object(out, obj)
        return out

    def finish(self) -> None:
        # every rank reaches the end before any tears gloo down: a rank that destroyed its group while the other
        # was still leaving made that one abort at exit ("terminate called without an active exception")
        self.dist.barrier()

    def close(self) -> None:
        if self.created:
            self.dist.destroy_process_group()


class _Horovod(_Collective):
    """Horovod: DistributedOptimizer averages gradients; parameters and optimizer state broadcast from rank 0."""

    name = "horovod"

    def __init__(self) -> None:
        try:
            import horovod.torch as hvd
        except ImportError as err:
            raise ImportError(HOROVOD_INSTALL_HINT) from err
        self.hvd = hvd
        hvd.init()
        self.rank, self.world_size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()

    def wrap(self, model: Captioner, optimizer: torch.optim.Optimizer,
             device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
        optimizer = self.hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        self.hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return model, optimizer

    def step(self, optimizer: torch.optim.Optimizer, model: Captioner, grad_clip: float) -> None:
        optimizer.synchronize()  # average gradients before clipping them
        if grad_clip:
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        with optimizer.skip_synchronize():
            optimizer.step()

    def mean(self, value: float, device: torch.device) -> float:
        return float(self.hvd.allreduce(torch.tensor([value], dtype=torch.float64), op=self.hvd.Average).item())

    def gather(self, obj: Any) -> list[Any]:
        return list(self.hvd.allgather_object(obj))


def _join(backend: str, device: torch.device) -> _Collective:
    if backend == "horovod":
        return _Horovod()
    import torch.distributed as dist

    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return _TorchDDP(device)
    return _Collective()


def _worker_device(preferred: str, local_rank: int) -> torch.device:
    """``auto`` or ``cuda`` on a GPU worker take the GPU of this local rank; ``cuda:N`` and ``cpu`` as given."""
    device = pick_device(preferred)
    if device.type == "cuda" and (preferred == "auto" or device.index is None):
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def train_worker(config: dict[str, Any], on_step: OnStep | None = None) -> dict[str, Any] | None:
    """Train a captioner on this worker's shard; rank 0 saves it to ``config["output_dir"]`` and returns a summary.

    ``config`` holds the fields of :class:`TrainConfig` (``train_paths`` and ``output_dir`` required). The summary
    has ``loss_first``/``loss_last`` (first and last step, mean over ranks), ``losses`` (every step),
    ``epoch_losses``, ``world_size``, ``steps``, ``rows`` and the first epoch's sharding: ``rows_per_rank``,
    ``shard_overlap`` (rows that two ranks both trained on: 0) and ``rows_covered``. Other ranks return None.
    """
    cfg = TrainConfig.from_dict(config)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = _worker_device(cfg.device, local_rank)
    collective = _join(cfg.backend, device)
    try:
        result = _train(cfg, collective, device, on_step)
        collective.finish()
        return result
    finally:
        collective.close()


def train_workers(configs: list[dict[str, Any]],
                  on_trained: Callable[[dict[str, Any], dict[str, Any] | None], None] | None = None
                  ) -> list[dict[str, Any] | None]:
    """Train several captioners one after the other in the same worker processes and process group (one launch of
    TorchDistributor or Horovod for many models, e.g. the cells of ``erg experiment``); rank 0 returns each one's
    summary (as :func:`train_worker`), the other ranks Nones. Every config must name the same device and backend.
    ``on_trained(config, summary)`` runs on every rank as each model is done (before the next starts), so that a
    launch stopped midway leaves its finished models recorded."""
    parsed = [TrainConfig.from_dict(c) for c in configs]
    if not parsed:
        raise ValueError("no training configs given")
    if len({(c.device, c.backend) for c in parsed}) > 1:
        raise ValueError("every config of one launch needs the same device and backend, got "
                         f"{sorted({(c.device, c.backend) for c in parsed})}")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = _worker_device(parsed[0].device, local_rank)
    collective = _join(parsed[0].backend, device)
    try:
        results = []
        for i, (raw, cfg) in enumerate(zip(configs, parsed), 1):
            results.append(_train(cfg, collective, device, None, (i, len(parsed))))
            if on_trained is not None:
                on_trained(raw, results[-1])
        collective.finish()
        return results
    finally:
        collective.close()


def _progress(cfg: TrainConfig, model_of: tuple[int, int], epoch: int, loss: float, started: float) -> str:
    """One line of training progress, e.g. ``train 2/8 nic (humor-augmented): epoch 3/8 loss 2.914 (412 s)``."""
    name = cfg.label or Path(cfg.output_dir).name
    return (f"train {model_of[0]}/{model_of[1]} {cfg.kind} ({name}): epoch {epoch + 1}/{cfg.epochs} loss {loss:.3f} "
            f"({time.time() - started:.0f} s)")


def _rank_data(cfg: TrainConfig, collective: _Collective):
    """(the rows this rank reads, their row ids, every row's caption and style in one order on all ranks, a function
    making this rank's sampler over a dataset of its rows)."""
    if cfg.train_format == "parquet":
        data = read_caption_parquet(cfg.train_paths, cfg.feature_column, cfg.style_column, cfg.caption_column,
                                    cfg.feature_regions, cfg.regions_column, cfg.source_column)
        return (data, np.arange(len(data.captions), dtype=np.int64), data.captions, data.styles,
                lambda dataset: DistributedSampler(dataset, num_replicas=collective.world_size, rank=collective.rank,
                                                   shuffle=True, seed=cfg.seed, drop_last=True))
    if len(cfg.train_paths) != 1:
        raise ValueError(f"train_format=mds reads one MDS dataset folder, got {len(cfg.train_paths)} paths")
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("HOROVOD_LOCAL_SIZE")
                           or collective.world_size)
    data, row_ids = read_caption_mds(cfg.train_paths[0], collective.rank, collective.world_size,
                                     collective.local_rank, local_world_size, cfg.feature_column, cfg.style_column,
                                     cfg.caption_column, cfg.feature_regions, cfg.regions_column, cfg.index_column,
                                     cfg.batch_size, cfg.source_column)
    by_row: dict[int, tuple[str, str]] = {}
    sizes = []
    for ids, captions, styles in collective.gather((row_ids.tolist(), data.captions, data.styles)):
        sizes.append(len(ids))
        by_row.update(zip(ids, zip(captions, styles)))
    keep = min(sizes)  # every rank takes the same number of steps (DDP all-reduces each one)
    data = CaptionData(data.features[:keep], data.styles[:keep], data.captions[:keep],
                       None if data.n_regions is None else data.n_regions[:keep],
                       None if data.sources is None else data.sources[:keep])
    order = sorted(by_row)
    return (data, row_ids[:keep], [by_row[i][0] for i in order], [by_row[i][1] for i in order],
            lambda dataset: DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True,
                                               seed=cfg.seed + collective.rank, drop_last=False))


def _train(cfg: TrainConfig, collective: _Collective, device: torch.device,
           on_step: OnStep | None, model_of: tuple[int, int] = (1, 1)) -> dict[str, Any] | None:
    started = time.time()
    data, row_ids, all_captions, all_styles, sampler_of = _rank_data(cfg, collective)
    if cfg.vocab_path:
        vocab = CaptionVocab.load(cfg.vocab_path)
    else:
        vocab = CaptionVocab.build(all_captions, sorted(set(all_styles)), cfg.min_count)
    unknown_styles = sorted(set(all_styles) - set(vocab.styles))
    if unknown_styles:
        raise ValueError(f"styles {unknown_styles} in the data are not in the vocabulary's {list(vocab.styles)}")
    rows = len(all_captions)
    if rows < collective.world_size:
        raise ValueError(f"{rows} training rows cannot be sharded over {collective.world_size} workers")
    mask = data.padding_mask()
    mask = torch.from_numpy(mask) if mask is not None else torch.zeros(data.features.shape[:2], dtype=torch.bool)
    weighted = cfg.inserted_word_weight != 1
    encoded = vocab.encode_batch(data.captions, data.styles, cfg.max_words)
    weights = (vocab.inserted_word_weights(data.captions, data.sources or [None] * len(data.captions),
                                           cfg.inserted_word_weight, cfg.max_words)
               if weighted else torch.ones(encoded.shape))
    dataset = TensorDataset(torch.from_numpy(row_ids), torch.from_numpy(data.features), encoded, mask, weights)
    n_weighted = int((weights != 1).sum())  # inserted words in this rank's rows
    sampler = sampler_of(dataset)
    loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler)

    torch.manual_seed(cfg.seed)
    model = build_captioner(cfg.kind, int(data.features.shape[-1]), vocab, **cfg.hparams).to(device)
    optimizer_class = torch.optim.Adam if cfg.optimizer == "adam" else torch.optim.AdamW
    optimizer = optimizer_class(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sampler_rng = torch.Generator(device=device).manual_seed(cfg.seed + 1000 * collective.rank)
    forward, optimizer = collective.wrap(model, optimizer, device)

    losses: list[float] = []
    epoch_losses: list[float] = []
    sampling: list[float] = []
    shard: list[int] = []
    total_steps = cfg.epochs * len(loader)
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        model.train()
        epoch_start = len(losses)
        probability = sampling_probability(cfg.scheduled_sampling, epoch)
        sampling.append(probability)
        for row_ids, features, tokens, padding, batch_weights in loader:
            if epoch == 0:
                shard.extend(row_ids.tolist())
            tokens, batch_weights = trim_padding(tokens, batch_weights, vocab.pad_id)
            padding = padding.to(device) if data.n_regions is not None else None
            loss = scheduled_sampling_loss(forward, features.to(device), tokens.to(device), vocab.pad_id,
                                           probability, padding, sampler_rng,
                                           batch_weights.to(device) if weighted else None)
            optimizer.zero_grad()  # Horovod's DistributedOptimizer takes no set_to_none; torch defaults to it
            loss.backward()
            collective.step(optimizer, model, cfg.grad_clip)
            value = collective.mean(float(loss.detach()), device)
            if not math.isfinite(value):
                raise FloatingPointError(f"training loss became {value} at step {len(losses) + 1}: lower lr "
                                         f"(now {cfg.lr}) or check the features for extreme values")
            losses.append(value)
            step = len(losses)
            if on_step is not None and collective.rank == 0 and (step % cfg.log_every == 0 or step == total_steps):
                on_step(step, {"loss": value, "epoch": float(epoch)})
        epoch_losses.append(float(np.mean(losses[epoch_start:])))
        if collective.rank == 0:
            print(_progress(cfg, model_of, epoch, epoch_losses[-1], started), file=sys.stderr, flush=True)

    gathered = collective.gather((shard, n_weighted))
    shards = [rows_seen for rows_seen, _ in gathered]
    # parquet: every rank holds every row; mds: each its own partition, so the ranks' counts add up
    weighted_words = sum(n for _, n in gathered) if cfg.train_format == "mds" else n_weighted
    if collective.rank == 0:
        save_captioner(model, cfg.output_dir)
    collective.gather(None)  # every rank waits for rank 0's save: a rank leaving the group early can abort gloo
    if collective.rank != 0:
        return None
    seen = [set(s) for s in shards]
    return {
        "loss_first": losses[0], "loss_last": losses[-1], "losses": losses, "epoch_losses": epoch_losses,
        "sampling_probability": sampling,
        "world_size": collective.world_size, "backend": collective.name, "device": str(device),
        "steps": len(losses), "rows": rows, "vocab_size": len(vocab),
        "inserted_words_weighted": weighted_words,
        "rows_per_rank": [len(s) for s in shards], "shard_overlap": sum(len(s) for s in seen) - len(set().union(*seen)),
        "rows_covered": len(set().union(*seen)), "output_dir": cfg.output_dir, "config": asdict(cfg),
        "seconds": time.time() - started,
    }
