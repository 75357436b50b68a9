"""Style-phrase extraction as an iterator pandas UDF (mapInPandas): one classifier per executor, batched."""
from __future__ import annotations

from typing import Callable, Iterator

import pandas as pd

from udfs.runtime import cached_style_classifier, limit_threads, task_device

STYLE_PHRASE_COLUMNS = ["scene_id", "style", "caption", "tokens", "importance", "style_phrase", "phrase_words",
                        "phrase_mask", "content", "layer", "head", "eps"]
STYLE_PHRASE_DDL = ("scene_id string, style string, caption string, tokens array<string>, importance array<double>, "
                    "style_phrase string, phrase_words array<string>, phrase_mask array<boolean>, content string, "
                    "layer int, head int, eps double")


def phrases_frame(batch: pd.DataFrame, records) -> pd.DataFrame:
    """Rows of ``style_phrases`` (without run columns) for a batch and its StylePhrase records."""
    return pd.DataFrame({
        "scene_id": batch["scene_id"].to_numpy(), "style": batch["style"].to_numpy(),
        "caption": batch["caption"].to_numpy(),
        "tokens": [r.tokens for r in records], "importance": [r.importance for r in records],
        "style_phrase": [r.style_phrase for r in records], "phrase_words": [r.phrase_words for r in records],
        "phrase_mask": [r.phrase_mask for r in records],
        "content": [r.content for r in records], "layer": [r.layer for r in records],
        "head": [r.head for r in records], "eps": [r.eps for r in records],
    }, columns=STYLE_PHRASE_COLUMNS)


def make_extractor(model_path: str, layer: int, head: int, eps: float, batch_size: int, device: str,
                   max_length: int) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """A mapInPandas function: (scene_id, style, caption) batches -> style_phrases rows."""

    def extract_batches(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from models.style_phrases import extract_style_phrases

        limit_threads()
        clf = cached_style_classifier(model_path, task_device(device), max_length)
        for frame in frames:
            if frame.empty:
                continue
            records = extract_style_phrases(clf, frame["caption"].tolist(), layer, head, eps, batch_size)
            yield phrases_frame(frame, records)

    return extract_batches
