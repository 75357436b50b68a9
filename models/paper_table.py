"""The paper's Table 2: a captioner trained on the original pairs against the same captioner on original + augmented.

Rows are style x run (``original``, ``augmented`` and ``delta`` = augmented - original), columns the metrics
BLEU-1, BLEU-3, METEOR, CIDEr, cls. (style accuracy of the generated captions) and ppl. (their perplexity under
the style's language model; lower is better, so a negative delta is a gain there).
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import pandas as pd

TABLE2_METRICS = ("BLEU-1", "BLEU-3", "METEOR", "CIDEr", "cls.", "ppl.")
RUNS = ("original", "augmented", "delta")
PERCENT_METRICS = ("BLEU-1", "BLEU-3", "METEOR", "CIDEr", "cls.")

StyleMetrics = Mapping[str, Mapping[str, float]]


def build_table2(original: StyleMetrics, augmented: StyleMetrics) -> pd.DataFrame:
    """Table 2 as a frame indexed by (style, run), columns the metrics present, in the paper's order.

    ``original`` and ``augmented`` map style -> {metric: value}; both must name the same styles and, per style,
    the same metrics (a subset of :data:`TABLE2_METRICS`). Styles keep the order of ``original``.
    """
    if not original:
        raise ValueError("no styles given: original and augmented map style -> {metric: value}")
    if set(original) != set(augmented):
        raise ValueError(f"original and augmented runs cover different styles: {sorted(original)} vs "
                         f"{sorted(augmented)}")
    rows: list[dict[str, float]] = []
    index: list[tuple[str, str]] = []
    metrics_seen: set[str] = set()
    for style in original:
        before, after = dict(original[style]), dict(augmented[style])
        if set(before) != set(after):
            raise ValueError(f"style {style!r}: original has metrics {sorted(before)}, augmented {sorted(after)}")
        unknown = sorted(set(before) - set(TABLE2_METRICS))
        if unknown:
            raise ValueError(f"style {style!r}: unknown metrics {unknown}; Table 2 has {list(TABLE2_METRICS)}")
        for run, values in (("original", before), ("augmented", after)):
            for metric, value in values.items():
                if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isinf(value):
                    raise ValueError(f"{run} {style!r} {metric} must be a finite number (or NaN), got {value!r}")
        rows += [before, after, {m: after[m] - before[m] for m in before}]
        index += [(style, run) for run in RUNS]
        metrics_seen |= set(before)
    columns = [m for m in TABLE2_METRICS if m in metrics_seen]
    return pd.DataFrame(rows, index=pd.MultiIndex.from_tuples(index, names=["style", "run"]), columns=columns)


def _formatted(table: pd.DataFrame, percent: bool, digits: int) -> pd.DataFrame:
    """Cell strings: BLEU/METEOR/CIDEr/cls. times 100 when ``percent`` (as the paper prints them), deltas signed."""
    out = pd.DataFrame(index=table.index, columns=table.columns, dtype=object)
    for (style, run), row in table.iterrows():
        for metric, value in row.items():
            scaled = value * 100 if percent and metric in PERCENT_METRICS else value
            text = "-" if pd.isna(scaled) else f"{scaled:{'+' if run == 'delta' else ''}.{digits}f}"
            out.loc[(style, run), metric] = text
    return out


def render_markdown(table: pd.DataFrame, percent: bool = True, digits: int = 1) -> str:
    """A GitHub markdown table of :func:`build_table2`'s frame, one line per (style, run)."""
    cells = _formatted(table, percent, digits)
    header = ["style", "run", *cells.columns]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(["---"] * 2 + ["---:"] * len(cells.columns)) + " |"]
    for (style, run), row in cells.iterrows():
        lines.append("| " + " | ".join([str(style), run, *row.tolist()]) + " |")
    return "\n".join(lines) + "\n"


def render_html(table: pd.DataFrame, percent: bool = True, digits: int = 1) -> str:
    """An HTML table of :func:`build_table2`'s frame (styles as row groups), for MLflow artifacts and notebooks."""
    return _formatted(table, percent, digits).to_html(escape=True)

