"""The three filters of the Generate step (DESIGN step 3), on a pandas frame of generated captions.

A generated caption is kept only if
- ``style``: the style classifier's argmax is the target style (``predicted_style == target_style``),
- ``perplexity``: its perplexity under the trigram LM of the target style is ``< ppl_max`` (paper: 80),
- ``similarity``: the retrieval similarity that paired its phrase with the factual caption is ``> min_similarity``
  (paper: 0.6). Retrieval keeps only hits above ``retrieve.min_similarity`` (0.6 too), so with equal thresholds
  this filter cannot reject anything; it bites only when retrieval keeps hits below the filter's threshold.

Beyond the paper, two filters catch fluent-looking nonsense that the three above pass:
- ``content``: the sentence encoder's cosine between the generated and the factual caption is
  ``> min_content_similarity`` (the generated caption still describes the factual scene);
- ``well_formed``: no non-word and no repeated word trigram (``well_formed_reason`` is None,
  see :func:`models.caption_quality.well_formedness`).

And, where the factual image has textual visual context (object labels with the label classifier's confidence):
- ``visual``: the generated caption's visual relatedness (:mod:`models.visual_relatedness`) is not below the factual
  caption's by more than ``max_relatedness_drop``: ``generated_relatedness >= factual_relatedness - margin``. A row
  whose ``factual_relatedness`` is NaN (no visual context) passes: there is nothing to drift from; a row with a
  factual score and a NaN generated score fails.
And ``fluent``: the fluency discriminator (:mod:`models.fluency`) gives ``fluency`` (p(fluent)) ``>= min_fluency``:
it catches the broken English the others pass ("... riding on the back end of his surfboard expert").
Each applies when its threshold / switch is given. A missing value (NaN / None) fails its filter. Thresholds are
always passed in; the paper's values are ``PAPER_PPL_MAX`` and ``PAPER_MIN_SIMILARITY``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

PAPER_PPL_MAX = 80.0
PAPER_MIN_SIMILARITY = 0.6
INPUT_COLUMNS = ("target_style", "predicted_style", "perplexity", "similarity")
FILTERS = ("style", "perplexity", "similarity", "content", "well_formed", "visual", "fluent")
VERDICT_COLUMNS = tuple(f"passed_{f}" for f in FILTERS) + ("passed",)


def _require_columns(df: pd.DataFrame, columns: Sequence[str], hint: str = "") -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"frame lacks column(s) {missing}; it has {list(df.columns)}{hint}")


def _numeric(df: pd.DataFrame, column: str) -> pd.Series:
    try:
        return pd.to_numeric(df[column], errors="raise").astype("float64")
    except (TypeError, ValueError) as err:
        raise ValueError(f"column {column!r} must be numeric (NaN allowed): {err}") from err


def apply_filters(df: pd.DataFrame, ppl_max: float, min_similarity: float, *,
                  min_content_similarity: float | None, well_formed: bool, max_relatedness_drop: float | None,
                  min_fluency: float | None = None) -> pd.DataFrame:
    """A copy of ``df`` with ``passed_<filter>`` for every filter, ``passed`` (bool) and ``reject_reason`` (None if
    passed, else the failed filters joined by ',', e.g. "style,perplexity"; a malformed caption's reason says why,
    e.g. "well_formed:nonword:keyain").

    ``min_content_similarity`` (needs column ``content_similarity``) and ``well_formed`` (needs column
    ``well_formed_reason``) switch the two filters beyond the paper on, ``max_relatedness_drop`` (needs columns
    ``factual_relatedness`` and ``generated_relatedness``) the visual one, ``min_fluency`` (needs column
    ``fluency``) the fluency one; a filter that is off passes every row."""
    _require_columns(df, INPUT_COLUMNS)
    thresholds = [("ppl_max", ppl_max), ("min_similarity", min_similarity)]
    if min_content_similarity is not None:
        thresholds.append(("min_content_similarity", min_content_similarity))
        _require_columns(df, ["content_similarity"], hint="; the content filter needs it")
    if well_formed:
        _require_columns(df, ["well_formed_reason"], hint="; the well-formedness filter needs it")
    if min_fluency is not None:
        thresholds.append(("min_fluency", min_fluency))
        _require_columns(df, ["fluency"], hint="; the fluency filter needs it")
    if max_relatedness_drop is not None:
        thresholds.append(("max_relatedness_drop", max_relatedness_drop))
        _require_columns(df, ["factual_relatedness", "generated_relatedness"], hint="; the visual filter needs them")
    for name, value in thresholds:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    out = df.copy()
    target, predicted = out["target_style"], out["predicted_style"]
    verdicts = {
        "style": (target.notna() & predicted.notna() & (target.astype(object) == predicted.astype(object))),
        "perplexity": _numeric(out, "perplexity") < ppl_max,  # NaN compares False
        "similarity": _numeric(out, "similarity") > min_similarity,
        "content": (_numeric(out, "content_similarity") > min_content_similarity
                    if min_content_similarity is not None else pd.Series(True, index=out.index)),
        "well_formed": (out["well_formed_reason"].isna() if well_formed else pd.Series(True, index=out.index)),
        "visual": (_visual_verdict(out, max_relatedness_drop) if max_relatedness_drop is not None
                   else pd.Series(True, index=out.index)),
        "fluent": (_numeric(out, "fluency") >= min_fluency if min_fluency is not None
                   else pd.Series(True, index=out.index)),
    }
    for name, passed in verdicts.items():
        out[f"passed_{name}"] = passed.fillna(False).astype(bool).to_numpy()
    failed = np.column_stack([~out[f"passed_{f}"].to_numpy() for f in FILTERS])
    out["passed"] = ~failed.any(axis=1)
    detail = out["well_formed_reason"].tolist() if well_formed else [None] * len(out)

    def reason(row, why) -> str | None:
        names = [f"well_formed:{why}" if f == "well_formed" and why else f for f, bad in zip(FILTERS, row) if bad]
        return ",".join(names) or None

    out["reject_reason"] = [reason(row, why) for row, why in zip(failed, detail)]
    return out


def _visual_verdict(df: pd.DataFrame, margin: float) -> pd.Series:
    """Pass where the image has no visual context (factual score NaN) or the generated caption's relatedness is at
    least the factual caption's minus ``margin``."""
    factual, generated = _numeric(df, "factual_relatedness"), _numeric(df, "generated_relatedness")
    return factual.isna() | (generated >= factual - margin - 1e-12)


def pass_rates(df: pd.DataFrame, by: Sequence[str] | None = ("target_style",)) -> pd.DataFrame:
    """Share of rows passing each filter and all of them, per group of ``by`` (None or empty: one overall row).

    Columns: the ``by`` columns, ``n``, ``pass_rate_<filter>`` for each of :data:`FILTERS`, ``pass_rate`` (all).
    """
    _require_columns(df, VERDICT_COLUMNS, hint="; run apply_filters first")
    by = list(by or [])
    _require_columns(df, by)
    rates = {f"pass_rate_{f}": (f"passed_{f}", "mean") for f in FILTERS}
    aggs = {"n": ("passed", "size"), **rates, "pass_rate": ("passed", "mean")}
    frame = df[by + list(VERDICT_COLUMNS)].astype({c: "float64" for c in VERDICT_COLUMNS})
    if by:
        return frame.groupby(by, dropna=False, sort=True).agg(**aggs).reset_index()
    return frame.assign(_all=0).groupby("_all").agg(**aggs).reset_index(drop=True)
