"""Style-phrase extraction as an iterator pandas UDF (mapInPandas): one classifier per style set and executor.

Each style set (e.g. FlickrStyle10K's humor/romantic, SentiCap's positive/negative) has its own classifier and style
head (l_s, h_s); a caption is split by the classifier and head of its style's set, and its row records that
classifier's version.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Callable, Iterator

import pandas as pd

from udfs.runtime import cached_style_classifier, limit_threads, task_device

STYLE_PHRASE_COLUMNS = ["scene_id", "style", "caption", "tokens", "importance", "style_phrase", "phrase_words",
                        "phrase_mask", "content", "layer", "head", "eps", "classifier_version"]
STYLE_PHRASE_DDL = ("scene_id string, style string, caption string, tokens array<string>, importance array<double>, "
                    "style_phrase string, phrase_words array<string>, phrase_mask array<boolean>, content string, "
                    "layer int, head int, eps double, classifier_version string")
EXTRACTOR_KEYS = ("styles", "path", "layer", "head", "eps", "max_length", "version")


def phrases_frame(batch: pd.DataFrame, records, classifier_version: str | None = None) -> pd.DataFrame:
    """Rows of ``style_phrases`` (without run columns) for a batch and its StylePhrase records."""
    return pd.DataFrame({
        "scene_id": batch["scene_id"].to_numpy(), "style": batch["style"].to_numpy(),
        "caption": batch["caption"].to_numpy(),
        "tokens": [r.tokens for r in records], "importance": [r.importance for r in records],
        "style_phrase": [r.style_phrase for r in records], "phrase_words": [r.phrase_words for r in records],
        "phrase_mask": [r.phrase_mask for r in records],
        "content": [r.content for r in records], "layer": [r.layer for r in records],
        "head": [r.head for r in records], "eps": [r.eps for r in records],
        "classifier_version": [classifier_version] * len(records),
    }, columns=STYLE_PHRASE_COLUMNS)


def check_extractors(extractors: Mapping[str, Mapping]) -> dict[str, dict]:
    """Per style set, its extractor record (the ``style_classifier/<set>`` current record); no style in two sets."""
    out, owner = {}, {}
    for name, record in extractors.items():
        missing = [key for key in EXTRACTOR_KEYS if key not in record]
        if missing:
            raise ValueError(f"extractor of style set {name!r} lacks {missing}")
        for style in record["styles"]:
            if style in owner:
                raise ValueError(f"style {style!r} is in style sets {owner[style]!r} and {name!r}")
            owner[style] = name
        out[name] = {key: record[key] for key in EXTRACTOR_KEYS}
    if not out:
        raise ValueError("no extractor given: train a style classifier per style set with `erg extract`")
    return out


def make_extractor(extractors: Mapping[str, Mapping], batch_size: int,
                   device: str) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """A mapInPandas function: (scene_id, style, caption) batches -> style_phrases rows, each caption split by its
    style set's classifier and head. ``extractors`` maps a style set to its record (keys :data:`EXTRACTOR_KEYS`)."""
    sets = check_extractors(extractors)

    def extract_batches(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from models.style_phrases import extract_style_phrases

        limit_threads()
        dev = task_device(device)
        for frame in frames:
            for record in sets.values():
                part = frame[frame["style"].isin(record["styles"])]
                if part.empty:
                    continue
                clf = cached_style_classifier(record["path"], dev, record["max_length"])
                phrases = extract_style_phrases(clf, part["caption"].tolist(), record["layer"], record["head"],
                                                record["eps"], batch_size)
                yield phrases_frame(part, phrases, record["version"])

    return extract_batches
