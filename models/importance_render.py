"""Pictures of the Extract step: the paper's Table 4 view and the layer x head confidence heatmap.

Each word of a caption is shaded by its importance under the selected head (paper Eq. 1), scaled by the caption's
most important word so the darkest word of every caption is its strongest; style phrase words are also bold and
underlined. :func:`importance_html` returns an HTML fragment, :func:`importance_png` draws the same view with
matplotlib, and :func:`confidence_heatmap_png` draws the Eq. 2 confidence matrix with (l_s, h_s) marked.
Figures are drawn on matplotlib's Agg canvas (no pyplot state), so this is safe in a job or executor.
"""
from __future__ import annotations

import html
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from models.style_phrases import StylePhrase

SHADE_RGB = (214, 39, 40)  # the red of the shading, 0-255


def _grouped(records: Sequence[StylePhrase], styles: Sequence[str],
             per_style: int) -> list[tuple[str, list[StylePhrase]]]:
    """The first ``per_style`` records of every style, styles in order of first appearance."""
    if len(records) != len(styles):
        raise ValueError(f"records and styles differ in length: {len(records)} records, {len(styles)} styles")
    if per_style < 1:
        raise ValueError(f"per_style must be at least 1, got {per_style}")
    groups: dict[str, list[StylePhrase]] = {}
    for record, style in zip(records, styles):
        group = groups.setdefault(style, [])
        if len(group) < per_style:
            group.append(record)
    return list(groups.items())


def shading(record: StylePhrase) -> np.ndarray:
    """Per-word shade in [0, 1]: importance divided by the caption's largest importance (0 if all are 0)."""
    importance = np.clip(np.asarray(record.importance, dtype=np.float64), 0.0, None)
    peak = importance.max() if importance.size else 0.0
    return importance / peak if peak > 0 else np.zeros_like(importance)


def importance_html(records: Sequence[StylePhrase], styles: Sequence[str], per_style: int = 4,
                    title: str = "Style phrases: word importance under the selected head") -> str:
    """Table 4 as an HTML fragment: one row per caption, grouped by style, words shaded by importance."""
    red, green, blue = SHADE_RGB
    rows = []
    for style, group in _grouped(records, styles, per_style):
        for record in group:
            spans = []
            for word, importance, shade, in_phrase in zip(record.tokens, record.importance, shading(record),
                                                          record.phrase_mask):
                weight = "font-weight:bold;text-decoration:underline;" if in_phrase else ""
                spans.append(f'<span style="background:rgba({red},{green},{blue},{shade:.3f});{weight}'
                             f'padding:1px 2px;" title="{importance:.4f}">{html.escape(word)}</span>')
            rows.append(f"<tr><td>{html.escape(style)}</td><td>{' '.join(spans) or '&nbsp;'}</td>"
                        f"<td>{html.escape(record.style_phrase)}</td><td>({record.layer}, {record.head})</td></tr>")
    return (f"<h3>{html.escape(title)}</h3>\n<table>\n<tr><th>style</th><th>caption</th><th>style phrase</th>"
            f"<th>(l, h)</th></tr>\n" + "\n".join(rows) + "\n</table>\n")


def importance_png(records: Sequence[StylePhrase], styles: Sequence[str], path: str | Path, per_style: int = 4,
                   title: str = "Style phrases: word importance under the selected head") -> Path:
    """Table 4 as a PNG at ``path``: one line per caption, each word on a box shaded by its importance."""
    lines = [(style, record) for style, group in _grouped(records, styles, per_style) for record in group]
    figure = Figure(figsize=(11, 0.45 * len(lines) + 0.9), dpi=110)
    canvas = FigureCanvasAgg(figure)
    axes = figure.add_axes((0.01, 0.01, 0.98, 0.98 - 0.5 / figure.get_figheight()))
    axes.set_axis_off()
    axes.set_title(title, fontsize=11, loc="left")
    renderer = canvas.get_renderer()
    axes_width = axes.get_window_extent(renderer).width
    color = np.array(SHADE_RGB) / 255.0
    for line, (style, record) in enumerate(lines):
        y = 1.0 - (line + 0.5) / max(len(lines), 1)
        axes.text(0.0, y, style, fontsize=9, style="italic", va="center", transform=axes.transAxes)
        x = 0.11
        for word, shade, in_phrase in zip(record.tokens, shading(record), record.phrase_mask):
            text = axes.text(x, y, word, fontsize=10, va="center", transform=axes.transAxes,
                             weight="bold" if in_phrase else "normal",
                             bbox={"boxstyle": "square,pad=0.15", "facecolor": (*color, float(shade)),
                                   "edgecolor": "none"})
            x += (text.get_window_extent(renderer).width + 6) / axes_width
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    canvas.print_png(str(target))
    return target


def confidence_heatmap_png(confidence: np.ndarray, selected: tuple[int, int], path: str | Path,
                           title: str = "Mean style confidence after removing each head's top words") -> Path:
    """Heatmap of the [L, H] Eq. 2 confidence matrix at ``path``, the selected (l_s, h_s) boxed."""
    confidence = np.asarray(confidence, dtype=np.float64)
    if confidence.ndim != 2 or 0 in confidence.shape:
        raise ValueError(f"confidence must be a non-empty [layers, heads] matrix, got shape {confidence.shape}")
    layer, head = selected
    if not (0 <= layer < confidence.shape[0] and 0 <= head < confidence.shape[1]):
        raise ValueError(f"selected (layer, head) = {selected} lies outside the {confidence.shape} matrix")
    n_layers, n_heads = confidence.shape
    figure = Figure(figsize=(max(4.0, 0.55 * n_heads + 2), max(3.0, 0.5 * n_layers + 1.5)), dpi=110)
    canvas = FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    image = axes.imshow(confidence, cmap="viridis", aspect="auto")
    figure.colorbar(image, ax=axes, label="mean c(h, l, y)")
    axes.add_patch(Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
    axes.set_xticks(range(n_heads))
    axes.set_yticks(range(n_layers))
    axes.set_xlabel("head h")
    axes.set_ylabel("layer l")
    axes.set_title(f"{title}\nselected (l_s, h_s) = ({layer}, {head}): {confidence[layer, head]:.3g}", fontsize=9)
    figure.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    canvas.print_png(str(target))
    return target
