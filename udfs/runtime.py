"""What every model UDF shares: the device Spark assigned to the task, and one model per executor process.

Iterator pandas UDFs call :func:`cached_model` with a key and a loader: the loader runs once per Python worker
(``spark.python.worker.reuse`` keeps workers alive across tasks), later batches and tasks reuse the model. On a
GPU executor :func:`task_device` returns the GPU that Spark assigned to this task
(``spark.task.resource.gpu.amount``), so concurrent tasks on one executor do not pile onto ``cuda:0``.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, Iterable, Iterator, TypeVar

import pandas as pd

_MODELS: dict[tuple, Any] = {}
_LOCK = threading.Lock()
T = TypeVar("T")


def _task_gpu_addresses() -> list[str]:
    """The GPU addresses Spark assigned to the running task; empty outside a Spark task (on the driver, in plain
    Python, or where pyspark is not installed) and on a task that claims no GPU."""
    try:
        from pyspark import TaskContext
    except ImportError:  # models used without Spark
        return []
    ctx = TaskContext.get()
    if ctx is None:  # not inside a Spark task
        return []
    gpus = ctx.resources().get("gpu")
    return list(gpus.addresses) if gpus is not None else []


def task_device(preferred: str = "auto") -> str:
    """``cuda:<addr>`` from the task's GPU resource when Spark assigned one, else what ``preferred`` resolves to.

    A task that Spark gave a GPU (``spark.task.resource.gpu.amount``) on a worker where torch sees no CUDA device
    fails, naming the fix, rather than running on CPU unnoticed; ``preferred="cpu"`` asks for the CPU explicitly.
    """
    from models.backbones import pick_device

    if preferred == "auto":
        addresses = _task_gpu_addresses()
        if addresses:
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError(
                    f"Spark assigned GPU {addresses[0]} to this task, but torch {torch.__version__} sees no CUDA "
                    f"device (CPU-only torch build, or no NVIDIA driver): install a CUDA build of torch on the "
                    f"workers, or set the model's device to cpu (e.g. --set embed.encoder.device=cpu)"
                )
            return f"cuda:{int(addresses[0]) % torch.cuda.device_count()}"
    return str(pick_device(preferred))


def cached_model(key: tuple, loader: Callable[[], T], *, latest_only: bool = False) -> T:
    """The model for ``key`` in this process, loaded by ``loader`` on first use.

    ``latest_only``: keep one entry of this kind (``key[0]``): loading a new key drops the others of its kind, e.g.
    the scene indexes of an earlier retrieval in a reused Python worker.
    """
    with _LOCK:
        if key not in _MODELS:
            if latest_only:
                for old in [k for k in _MODELS if k[0] == key[0]]:
                    del _MODELS[old]
            _MODELS[key] = loader()
        return _MODELS[key]


def limit_threads() -> None:
    """One torch thread per Python worker when Spark runs several workers per machine (local[*])."""
    import torch

    threads = int(os.environ.get("ERG_TORCH_THREADS", "0") or 0)
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def rebatch(frames: Iterable[pd.DataFrame], size: int) -> Iterator[pd.DataFrame]:
    """Re-cut Arrow batches into model batches of ``size`` rows (the last may be smaller)."""
    pending: list[pd.DataFrame] = []
    count = 0
    for frame in frames:
        pending.append(frame)
        count += len(frame)
        while count >= size:
            whole = pd.concat(pending, ignore_index=True)
            yield whole.iloc[:size].reset_index(drop=True)
            rest = whole.iloc[size:].reset_index(drop=True)
            pending, count = ([rest] if len(rest) else []), len(rest)
    if count:
        yield pd.concat(pending, ignore_index=True)


def cached_style_classifier(path: str, device: str, max_length: int):
    """The trained style classifier at ``path`` (labels read from it), once per process and device."""
    from models.style_classifier import load_style_classifier

    return cached_model(("style_classifier", path, device, max_length),
                        lambda: load_style_classifier(path, None, device=device, max_length=max_length))


def cached_style_lms(path: str):
    """The per-style trigram LMs saved at ``path``, once per process."""
    from models.trigram_lm import StyleLanguageModels

    return cached_model(("style_lms", path), lambda: StyleLanguageModels.load(path))


def cached_evaluation_classifiers(path: str, device: str):
    """The per-style evaluation classifiers saved at ``path`` (``erg extract``), once per process and device."""
    from models.caption_scoring import load_evaluation_classifiers

    return cached_model(("evaluation_classifiers", path, device), lambda: load_evaluation_classifiers(path, device))


def cached_caption_scoring(classifiers_path: str, lm_path: str | None, device: str):
    """``(evaluation classifiers, trigram LMs or None)`` for :func:`models.caption_scoring.score_captions`, loaded
    once per process: generation (filters 1-2) and evaluation (cls., ppl.) score through the same models."""
    return (cached_evaluation_classifiers(classifiers_path, device),
            cached_style_lms(lm_path) if lm_path else None)
