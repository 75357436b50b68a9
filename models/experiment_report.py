"""The report of ``erg experiment``: the paper's Table 2, Table 5 and Fig. 5 from the scored cells (no Spark).

A *row* is one trained and scored cell: ``style``, ``captioner``, ``variant`` (``original``, ``augmented``, or
``augmented:<type>`` for one retrieval type's pairs alone, ``augmented@<share>`` for a share of the augmented
pairs), ``types`` (retrieval types of its augmented pairs), ``fraction`` (share of the augmented pairs), the metrics
``bleu1, bleu3, meteor, cider, cls, cls_independent, ppl`` and ``train_pairs`` (plus ``train_pairs_original`` /
``train_pairs_augmented``, ``test_images``). Metrics are fractions (CIDEr its usual scale); the tables print
BLEU, METEOR, CIDEr and cls. times 100, as the paper.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

METRICS = ("bleu1", "bleu3", "meteor", "cider", "cls", "cls_independent", "ppl")
HEADERS = {"bleu1": "B-1", "bleu3": "B-3", "meteor": "M", "cider": "C", "cls": "cls.",
           "cls_independent": "cls. (indep.)", "ppl": "ppl."}
PERCENT = ("bleu1", "bleu3", "meteor", "cider", "cls", "cls_independent")


def _number(value: Any, metric: str, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    scaled = value * 100 if metric in PERCENT else value
    return f"{scaled:{'+' if signed else ''}.1f}"


def cider_gain_percent(original: float, augmented: float) -> float:
    """Relative CIDEr change in percent, as the paper's "+2.4% to +39.2%" (NaN when the original is 0 or NaN)."""
    if original is None or augmented is None or not original or math.isnan(original) or math.isnan(augmented):
        return float("nan")
    return (augmented - original) / original * 100.0


# Two-sided 95% quantiles of Student's t by degrees of freedom (1-30); beyond 30 the normal's 1.96 is within 2%.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
DELTAS = ("delta_cider_percent", "delta_cls", "delta_cls_independent")
CELL_KEYS = ("style", "captioner", "variant")


def t_interval(values: Sequence[float]) -> dict[str, Any] | None:
    """Mean and 95% t-interval of ``values`` (the seeds' paired deltas): ``{"mean", "sd", "low", "high", "n",
    "excludes_zero"}``; None with fewer than two finite values (one seed gives no interval)."""
    finite = [float(v) for v in values if v is not None and not math.isnan(v)]
    n = len(finite)
    if n < 2:
        return None
    mean = sum(finite) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in finite) / (n - 1))
    half = (_T975[n - 2] if n - 1 <= len(_T975) else 1.96) * sd / math.sqrt(n)
    return {"mean": mean, "sd": sd, "low": mean - half, "high": mean + half, "n": n,
            "excludes_zero": bool(mean - half > 0 or mean + half < 0)}


def _cell(row: Mapping[str, Any]) -> tuple:
    return tuple(row[k] for k in CELL_KEYS)


def aggregate_seeds(seed_rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell (style, captioner, variant) from its seeds' rows, in first-seen order: every metric the mean
    over the seeds, ``seeds`` (each seed), ``run_ids`` (each seed's run; ``run_id`` the first's), ``per_seed``
    (metric -> each seed's value, in ``seeds`` order) and ``sd`` (metric -> sample standard deviation, 0 for one
    seed); counts (pairs, test images) from the first seed."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for row in seed_rows:
        groups.setdefault(_cell(row), []).append(row)
    out = []
    for group in groups.values():
        group = sorted(group, key=lambda r: r.get("seed", 0))
        row = dict(group[0])
        row["seeds"] = [r.get("seed") for r in group]
        row["run_ids"] = [r.get("run_id") for r in group]
        row["per_seed"], row["sd"] = {}, {}
        for metric in METRICS:
            values = [r.get(metric) for r in group]
            finite = [float(v) for v in values if v is not None and not math.isnan(v)]
            row["per_seed"][metric] = values
            row[metric] = sum(finite) / len(finite) if finite else float("nan")
            row["sd"][metric] = (math.sqrt(sum((v - row[metric]) ** 2 for v in finite) / (len(finite) - 1))
                                 if len(finite) > 1 else 0.0)
        for key in ("seed", "fingerprint", "reused"):
            row.pop(key, None)
        out.append(row)
    return out


def seed_deltas(seed_rows: Sequence[Mapping[str, Any]], baseline: str = "original") -> list[dict[str, Any]]:
    """Every cell's deltas against ``baseline`` of the same style and captioner, paired by seed (a seed's cell minus
    the baseline's cell trained with the same seed), each with its 95% t-interval over the seeds: ``{"style",
    "captioner", "variant", "baseline", "seeds", "per_seed": {delta: [...]}, "ci95": {delta: t_interval or None}}``
    (ΔC % relative, Δcls. and Δcls. (indep.) in points)."""
    base = {(r["style"], r["captioner"], r.get("seed")): r for r in seed_rows if r["variant"] == baseline}
    groups: dict[tuple, list[tuple[Mapping[str, Any], Mapping[str, Any]]]] = {}
    for row in seed_rows:
        before = base.get((row["style"], row["captioner"], row.get("seed")))
        if row["variant"] != baseline and before is not None:
            groups.setdefault(_cell(row), []).append((before, row))
    out = []
    for (style, captioner, variant), pairs in groups.items():
        pairs.sort(key=lambda p: p[1].get("seed", 0))
        per_seed = {
            "delta_cider_percent": [cider_gain_percent(b["cider"], a["cider"]) for b, a in pairs],
            "delta_cls": [(a["cls"] - b["cls"]) * 100.0 for b, a in pairs],
            "delta_cls_independent": [(a["cls_independent"] - b["cls_independent"]) * 100.0
                                      if a.get("cls_independent") is not None
                                      and b.get("cls_independent") is not None else float("nan")
                                      for b, a in pairs]}
        out.append({"style": style, "captioner": captioner, "variant": variant, "baseline": baseline,
                    "seeds": [a.get("seed") for _, a in pairs], "per_seed": per_seed,
                    "ci95": {k: t_interval(v) for k, v in per_seed.items()}})
    return out


ABLATION_WORDS = {"random_scene": "a random train scene's phrase (same generator)",
                  "graft": "the retrieved phrase grafted without the generator"}


def _interval(interval: Mapping[str, Any] | None, values: Sequence[float]) -> str:
    if interval:
        return (f"{interval['mean']:+.1f} [{interval['low']:+.1f}, {interval['high']:+.1f}]"
                + ("*" if interval["excludes_zero"] else ""))
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return f"{sum(finite) / len(finite):+.1f}" if finite else "-"


def ablation_sentence(delta: Mapping[str, Any]) -> str:
    """One plain sentence on what an ablation shows for one style (by Δcls. and ΔC %, and their intervals)."""
    cls = delta["ci95"].get("delta_cls")
    cider = delta["ci95"].get("delta_cider_percent")
    what = ABLATION_WORDS.get(delta["ablation"], delta["ablation"])

    def verdict(interval, name):
        if not interval:
            return f"{name} {_interval(None, delta['per_seed'][_key(name)])} (one seed: no interval)"
        if interval["low"] > 0:
            return f"ERG is higher on {name} ({_interval(interval, [])})"
        if interval["high"] < 0:
            return f"ERG is lower on {name} ({_interval(interval, [])})"
        return f"no difference on {name} can be told from seed noise ({_interval(interval, [])})"

    return (f"{delta['style']}, {delta['captioner']}: against {what}, " + verdict(cls, "cls.") + "; "
            + verdict(cider, "C %") + ".")


def _key(name: str) -> str:
    return {"cls.": "delta_cls", "C %": "delta_cider_percent"}[name]


def render_ablations(pairs: Mapping[str, Mapping[str, Any]], deltas: Sequence[Mapping[str, Any]]) -> str:
    """ERG minus each ablation per style (ΔC % relative, Δcls. and Δcls. (indep.) in points, paired by seed, 95%
    t-interval over the seeds), the pair counts behind them, and one sentence per ablation and style."""
    lines = ["| ablation | style | captioner | ERG pairs | ablation pairs (passed / tried) | ΔC % | Δcls. | "
             "Δcls. (indep.) | seeds |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for d in deltas:
        n = pairs.get(d["ablation"], {}).get(d["style"], {})
        lines.append(f"| {d['ablation']} | {d['style']} | {d['captioner']} | {n.get('erg_pool', '-')} | "
                     f"{n.get('trained', '-')} ({n.get('passed', '-')} / {n.get('candidates', '-')}) | "
                     + " | ".join(_interval(d["ci95"].get(k), d["per_seed"][k]) for k in DELTAS)
                     + f" | {len(d['seeds'])} |")
    return "\n".join(lines + [""] + [f"- {ablation_sentence(d)}" for d in deltas]) + "\n"


def table2_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The Table 2 cells (``variant`` original / augmented) with, on each augmented row, ``delta_cider_percent`` and
    ``delta_cls`` (points) against the original row of the same style and captioner."""
    base = {(r["style"], r["captioner"]): r for r in rows if r["variant"] == "original"}
    out = []
    for row in rows:
        if row["variant"] not in ("original", "augmented"):
            continue
        row = dict(row)
        before = base.get((row["style"], row["captioner"]))
        if row["variant"] == "augmented" and before is not None:
            row["delta_cider_percent"] = cider_gain_percent(before["cider"], row["cider"])
            row["delta_cls"] = (row["cls"] - before["cls"]) * 100.0
            if row.get("cls_independent") is not None and before.get("cls_independent") is not None:
                row["delta_cls_independent"] = (row["cls_independent"] - before["cls_independent"]) * 100.0
        out.append(row)
    return out


def table2_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How augmenting moved CIDEr and cls. over the Table 2 cells (style x captioner): ``cells``, ``cider_up``,
    ``cls_up`` / ``cls_equal`` / ``cls_down`` (cls. as printed, to 0.1 point), and per style the captioners whose
    cls. rose (``cls_up_by_style``), whether it rose with every captioner (``cls_up_every_captioner``) and the
    style's cls. over its captioners, original vs augmented (``cls_by_style``: mean, delta in points)."""
    pairs = [r for r in table2_rows(rows) if r["variant"] == "augmented" and "delta_cls" in r]
    moved = [round(r["delta_cls"], 1) for r in pairs]
    by_style: dict[str, list[str]] = {}
    for r, delta in zip(pairs, moved):
        by_style.setdefault(r["style"], [])
        if delta > 0:
            by_style[r["style"]].append(r["captioner"])
    captioners = {s: sum(1 for r in pairs if r["style"] == s) for s in by_style}
    original = {(r["style"], r["captioner"]): r["cls"] for r in rows if r["variant"] == "original"}
    cls_by_style = {}
    for style in by_style:
        mine = [r for r in pairs if r["style"] == style]
        after = sum(r["cls"] for r in mine) / len(mine)
        before = sum(original[(r["style"], r["captioner"])] for r in mine) / len(mine)
        cls_by_style[style] = {"original": before, "augmented": after, "delta": round((after - before) * 100, 1)}
    return {"cells": len(pairs),
            "cider_up": sum(1 for r in pairs if r.get("delta_cider_percent", math.nan) > 0),
            "cls_up": sum(1 for d in moved if d > 0), "cls_equal": sum(1 for d in moved if d == 0),
            "cls_down": sum(1 for d in moved if d < 0), "cls_up_by_style": by_style,
            "cls_up_every_captioner": {s: len(up) == captioners[s] for s, up in by_style.items()},
            "cls_by_style": cls_by_style}


def render_summary(summary: Mapping[str, Any]) -> str:
    """One sentence per count of :func:`table2_summary`."""
    styles = ", ".join(f"{s} ({'every captioner' if summary['cls_up_every_captioner'][s] else ', '.join(up) or 'none'})"
                       for s, up in summary["cls_up_by_style"].items())
    means = "; ".join(f"{s} {v['original'] * 100:.1f} -> {v['augmented'] * 100:.1f} ({v['delta']:+.1f})"
                      for s, v in (summary.get("cls_by_style") or {}).items())
    return (f"Augmented vs original over {summary['cells']} cells: CIDEr up in {summary['cider_up']}; cls. up in "
            f"{summary['cls_up']}, equal in {summary['cls_equal']}, down in {summary['cls_down']}. cls. up by style: "
            f"{styles}." + (f" cls. by style (mean over its captioners): {means}." if means else "") + "\n")


def render_table2(rows: Sequence[Mapping[str, Any]]) -> str:
    """Table 2 as markdown: per style and captioner, original then augmented with delta C % and delta cls."""
    lines = ["| style | captioner | data | " + " | ".join(HEADERS[m] for m in METRICS)
             + " | pairs | ΔC % | Δcls. | Δcls. (indep.) |",
             "| --- | --- | --- | " + " | ".join("---:" for _ in METRICS) + " | ---: | ---: | ---: | ---: |"]
    for row in table2_rows(rows):
        deltas = [_delta(row, key) for key in DELTAS]
        lines.append(f"| {row['style']} | {row['captioner']} | {row['variant']} | "
                     + " | ".join(_spread(row, m) for m in METRICS)
                     + f" | {row['train_pairs']} | " + " | ".join(deltas) + " |")
    seeds = sorted({len(r.get("seeds") or [None]) for r in rows})
    if seeds != [1]:
        per = {}
        for r in rows:
            per.setdefault(r["captioner"], set()).add(len(r.get("seeds") or [None]))
        said = "; ".join(f"{c} {', '.join(map(str, sorted(n)))}" for c, n in per.items())
        lines += ["", f"Seeds per cell: {said}. Metrics are the mean ± sd over the seeds; "
                  "each delta is the mean of the seeds' paired deltas with its 95% t-interval over the seeds in "
                  "brackets, * where the interval excludes 0."]
    return "\n".join(lines) + "\n"


def _spread(row: Mapping[str, Any], metric: str) -> str:
    """A metric as printed, with ``± sd`` where the row has more than one seed."""
    text = _number(row.get(metric), metric)
    if len(row.get("seeds") or []) > 1 and text != "-":
        text += " ± " + _number((row.get("sd") or {}).get(metric), metric)
    return text


def _delta(row: Mapping[str, Any], key: str) -> str:
    """A delta as printed: the paired mean with its 95% interval (and * if it excludes 0) where the row has one,
    else the delta of the means."""
    interval = (row.get("ci95") or {}).get(key)
    if interval:
        return (f"{interval['mean']:+.1f} [{interval['low']:+.1f}, {interval['high']:+.1f}]"
                + ("*" if interval["excludes_zero"] else ""))
    value = row.get(key)
    return "-" if value is None or math.isnan(value) else f"{value:+.1f}"


def table2_seed_stats(result: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`render_table2` prints over the seeds, for ``table2.json``: read from the same row fields
    (``seeds``, ``sd``, ``per_seed``, ``ci95``, computed once by the experiment), not computed again.

    Returns ``{"seeds", "ci95", "why_null"}``: ``seeds`` every seed of a Table 2 cell, sorted; ``ci95`` one entry per
    style and captioner, in the table's order: ``{"style", "captioner", "seeds" (the paired seeds), "deltas": {delta:
    the t_interval the markdown prints in brackets ({"mean", "sd", "low", "high", "n", "excludes_zero"}, ΔC % relative,
    Δcls. in points) with "per_seed" (the seeds' paired deltas), or None for one seed}, "metrics": {variant: {"seeds",
    metric: {"mean", "sd", "per_seed"}}}}`` (metrics as fractions, as in ``rows``; the markdown prints mean ± sd x 100
    except ppl.). ``seeds`` / ``ci95`` are None where the rows have no seeds / no interval, with the reason in
    ``why_null``."""
    rows = table2_rows(result.get("rows") or [])
    paired = {_cell(d): d for d in result.get("deltas") or []}
    seeds = sorted({s for r in rows for s in (r.get("seeds") or []) if s is not None})
    cells: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        entry = cells.setdefault((row["style"], row["captioner"]), {
            "style": row["style"], "captioner": row["captioner"], "seeds": None, "deltas": {}, "metrics": {}})
        entry["metrics"][row["variant"]] = {"seeds": row.get("seeds"), **{
            m: {"mean": row.get(m), "sd": (row.get("sd") or {}).get(m), "per_seed": (row.get("per_seed") or {}).get(m)}
            for m in METRICS}}
        if row.get("ci95") is not None:
            deltas = paired.get(_cell(row), {})
            entry["seeds"] = deltas.get("seeds", row.get("seeds"))
            entry["deltas"] = {k: None if row["ci95"].get(k) is None else
                               {**row["ci95"][k], "per_seed": (deltas.get("per_seed") or {}).get(k)} for k in DELTAS}
    ci95 = list(cells.values())
    why_null = {}
    if not seeds:
        why_null["seeds"] = "the result's rows name no seeds (an experiment from before seeds were recorded)"
    if not any(interval for entry in ci95 for interval in entry["deltas"].values()):
        why_null["ci95"] = ("no Table 2 cell has two or more seeds paired with its original cell: the markdown "
                            "prints each delta of the means without an interval")
        ci95 = None
    return {"seeds": seeds or None, "ci95": ci95, "why_null": why_null}


def render_table5(rows: Sequence[Mapping[str, Any]], captioner: str, styles: Sequence[str]) -> str:
    """Table 5: the original pairs alone, each retrieval type's augmented pairs alone (+ original), all types."""
    chosen = [r for r in rows if r["captioner"] == captioner and r["style"] in styles
              and (r["variant"] in ("original", "augmented") or r["variant"].startswith("augmented:"))]
    if not chosen:
        return ""
    order = {"original": 0, "augmented": 2}
    chosen.sort(key=lambda r: (list(styles).index(r["style"]), order.get(r["variant"], 1), r["variant"]))
    lines = ["| style | augmented pairs | " + " | ".join(HEADERS[m] for m in METRICS) + " | pairs |",
             "| --- | --- | " + " | ".join("---:" for _ in METRICS) + " | ---: |"]
    for row in chosen:
        label = {"original": "none (original)", "augmented": "all types"}.get(
            row["variant"], row["variant"].split(":", 1)[-1] + " alone")
        lines.append(f"| {row['style']} | {label} | " + " | ".join(_number(row.get(m), m) for m in METRICS)
                     + f" | {row['train_pairs']} |")
    return "\n".join(lines) + "\n"


def size_curve(rows: Sequence[Mapping[str, Any]], captioner: str, styles: Sequence[str]) -> list[dict[str, Any]]:
    """Fig. 5's points: per style, (share of augmented pairs, train pairs, CIDEr, cls.), by share."""
    points = []
    for row in rows:
        if row["captioner"] != captioner or row["style"] not in styles or row.get("eps") is not None:
            continue
        if row["variant"] == "original":
            share = 0.0
        elif row["variant"] == "augmented":
            share = 1.0
        elif row["variant"].startswith("augmented@"):
            share = float(row["variant"].split("@", 1)[1])
        else:
            continue
        points.append({"style": row["style"], "share": share, "train_pairs": row["train_pairs"],
                       "cider": row["cider"], "cls": row["cls"], "cls_independent": row.get("cls_independent")})
    return sorted(points, key=lambda p: (list(styles).index(p["style"]), p["share"]))


def render_fig5(points: Sequence[Mapping[str, Any]]) -> str:
    """Fig. 5's points as a markdown table."""
    if not points:
        return ""
    lines = ["| style | share of augmented pairs | pairs | C | cls. | cls. (indep.) |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for p in points:
        lines.append(f"| {p['style']} | {p['share'] * 100:.0f}% | {p['train_pairs']} | {_number(p['cider'], 'cider')}"
                     f" | {_number(p['cls'], 'cls')} | {_number(p.get('cls_independent'), 'cls')} |")
    return "\n".join(lines) + "\n"


def eps_curve(rows: Sequence[Mapping[str, Any]], captioner: str, styles: Sequence[str], default_eps: float
              ) -> list[dict[str, Any]]:
    """Fig. 5's eps points: per style, (eps, augmented pairs, CIDEr, cls.) of the captioner trained on the original
    plus all augmented pairs of the ERG run at that eps (the main run's ``augmented`` cell at ``default_eps``; an
    eps sweep cell carries its ``eps``), by eps; ``original`` is the same style's cell without augmented pairs."""
    original = {r["style"]: r for r in rows if r["captioner"] == captioner and r["variant"] == "original"}
    points = []
    for row in rows:
        if row["captioner"] != captioner or row["style"] not in styles:
            continue
        if row.get("eps") is not None:
            eps = float(row["eps"])
        elif row["variant"] == "augmented":
            eps = float(default_eps)
        else:
            continue
        before = original.get(row["style"], {})
        points.append({"style": row["style"], "eps": eps, "augmented_pairs": row.get("train_pairs_augmented"),
                       "cider": row["cider"], "cls": row["cls"], "cls_independent": row.get("cls_independent"),
                       "original_cider": before.get("cider"), "original_cls": before.get("cls")})
    return sorted(points, key=lambda p: (list(styles).index(p["style"]), p["eps"]))


def render_fig5_eps(points: Sequence[Mapping[str, Any]]) -> str:
    """Fig. 5's eps points as a markdown table (the original cell's C and cls. beside each)."""
    if not points:
        return ""
    lines = ["| style | eps | augmented pairs | C | cls. | cls. (indep.) | C (original) | cls. (original) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for p in points:
        lines.append(f"| {p['style']} | {p['eps']:g} | {p['augmented_pairs']} | {_number(p['cider'], 'cider')} | "
                     f"{_number(p['cls'], 'cls')} | {_number(p.get('cls_independent'), 'cls')} | "
                     f"{_number(p.get('original_cider'), 'cider')} | {_number(p.get('original_cls'), 'cls')} |")
    return "\n".join(lines) + "\n"


def _save(fig, axes, path: str | Path) -> Path:
    """The legend on the first panel, then the figure written as a PNG at ``path`` and closed."""
    import matplotlib.pyplot as plt

    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_table2(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Bars of CIDEr and cls., original vs augmented, per style x captioner (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({(r["style"], r["captioner"]) for r in rows if r["variant"] in ("original", "augmented")})
    value = {(r["style"], r["captioner"], r["variant"]): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(max(6, 1.2 * len(cells) + 3), 3.6))
    for ax, metric, title in ((axes[0], "cider", "CIDEr x 100"), (axes[1], "cls", "cls. (%)")):
        for offset, variant in ((-0.2, "original"), (0.2, "augmented")):
            heights = [100 * (value.get((s, c, variant), {}).get(metric) or 0.0) for s, c in cells]
            ax.bar([i + offset for i in range(len(cells))], heights, width=0.4, label=variant)
        ax.set_xticks(range(len(cells)), [f"{s}\n{c}" for s, c in cells], fontsize=8)
        ax.set_title(title)
    return _save(fig, axes, path)


def plot_fig5(points: Sequence[Mapping[str, Any]], path: str | Path, x: str = "share") -> Path:
    """CIDEr and cls. against the share of augmented pairs (``x`` share) or eps (``x`` eps), one line per style
    (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4))
    for style in dict.fromkeys(p["style"] for p in points):
        mine = [p for p in points if p["style"] == style]
        xs = [100 * p["share"] if x == "share" else p["eps"] for p in mine]
        axes[0].plot(xs, [100 * p["cider"] for p in mine], marker="o", label=style)
        axes[1].plot(xs, [100 * p["cls"] for p in mine], marker="o", label=style)
    for ax, title in ((axes[0], "CIDEr x 100"), (axes[1], "cls. (%)")):
        ax.set_xlabel("augmented pairs used (%)" if x == "share" else "extraction proportion eps")
        ax.set_title(title)
    return _save(fig, axes, path)


def caption_modes(hypotheses, top: int = 3) -> list[dict[str, Any]]:
    """Per cell (``variant`` = ``style/captioner/data``): how many of its test captions are distinct, and its ``top``
    most frequent captions with their count and whether the style's evaluation classifier calls them the style
    (p > 0.5): where cls. moves, this shows which repeated caption moved it. ``hypotheses``: the experiment's
    ``hypotheses.parquet`` (variant, hypothesis, style_probability)."""
    out = []
    for name, group in hypotheses.groupby("variant", sort=False):
        style, captioner, variant = str(name).split("/", 2)
        counts = group.groupby("hypothesis").agg(count=("hypothesis", "size"),
                                                 styled=("style_probability", lambda p: bool((p > 0.5).all())))
        counts = counts.sort_values(["count"], ascending=False, kind="stable").head(top)
        out.append({"style": style, "captioner": captioner, "variant": variant, "captions": len(group),
                    "distinct": int(group["hypothesis"].nunique()),
                    "top": [{"caption": c, "count": int(r["count"]), "styled": bool(r["styled"])}
                            for c, r in counts.iterrows()]})
    return out


def render_modes(modes: Sequence[Mapping[str, Any]]) -> str:
    """The most frequent captions per cell as a markdown table."""
    lines = ["| style | captioner | data | distinct / captions | most frequent captions (count, cls.) |",
             "| --- | --- | --- | ---: | --- |"]
    for m in modes:
        top = "; ".join(f"{t['caption'].replace('|', '/')} ({t['count']}, {'style' if t['styled'] else 'factual'})"
                        for t in m["top"])
        lines.append(f"| {m['style']} | {m['captioner']} | {m['variant']} | {m['distinct']} / {m['captions']} | "
                     f"{top} |")
    return "\n".join(lines) + "\n"


def _value_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return str(value)


def _signed(value: Any, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.1f}{unit}"


def render_tuning(tuning: Mapping[str, Any]) -> str:
    """The val-scored sweep (``experiment.tuning``): per knob, each value's val deltas (means over the tuning styles,
    and per style C and cls., original -> augmented), the value chosen and why."""
    lines = [f"Every setting here was chosen on the **{tuning['split']}** split before Table 2 was trained; no test "
             f"image was captioned or scored for it. Captioner {tuning['captioner']}, seed {tuning['seed']}, styles "
             f"{', '.join(tuning['styles'])} (val images: "
             + ", ".join(f"{s} {n}" for s, n in (tuning.get("val_images") or {}).items()) + "). "
             f"Criterion, declared in the conf: {tuning['criterion']['text']}.", ""]
    for knob in tuning["knobs"]:
        lines += [f"### {knob['key']}: chosen {_value_text(knob['chosen'])} (conf: {_value_text(knob['conf_value'])})",
                  "", "| value | ΔC % | Δcls. | Δcls. (indep.) | per style: C, cls. (original -> augmented) | "
                  "chosen |", "| --- | ---: | ---: | ---: | --- | --- |"]
        for r in knob["results"]:
            per = "; ".join(f"{s} C {_number(v['original']['cider'], 'cider')} -> "
                            f"{_number(v['augmented']['cider'], 'cider')}, cls. {_number(v['original']['cls'], 'cls')}"
                            f" -> {_number(v['augmented']['cls'], 'cls')}" for s, v in r["styles"].items())
            if r.get("not_measured"):
                per += ("; " if per else "") + "not measured: " + ", ".join(r["not_measured"])
            lines.append(f"| {_value_text(r['value'])} | {_signed(r['delta_cider_percent'], '%')} | "
                         f"{_signed(r['delta_cls'])} | {_signed(r['delta_cls_independent'])} | {per} | "
                         f"{'yes' if r.get('chosen') else ''} |")
        lines += [""]
        if knob.get("styles") is not None and list(knob["styles"]) != list(tuning["styles"]):
            lines += [f"Compared on {', '.join(knob['styles']) or 'no style'}: the other tuning styles were measured "
                      "under no value.", ""]
        lines += [f"Why: {knob['why']}.", ""]
    return "\n".join(lines) + "\n"


def render_report(result: Mapping[str, Any]) -> str:
    """The whole report as markdown: setup, Table 2, Table 5, Fig. 5, leakage, styles not measured, the most
    frequent captions per cell, samples."""
    rows = result["rows"]
    parts = ["# ERG experiment: original vs augmented (paper Table 2, Table 5, Fig. 5)", ""]
    parts += [f"- command: `{result.get('command', '')}`",
              f"- scene features: {result.get('features', '')}",
              f"- augmented pairs: {result.get('augmented_source', '')}",
              f"- test images: {result.get('test_source', '')}",
              f"- training: {result.get('training', '')}",
              f"- cls.: {result.get('cls_source', '')}",
              f"- ppl.: {result.get('ppl_source', '')}"]
    if result.get("seconds") is not None:
        stages = ", ".join(f"{k} {v:.0f}s" for k, v in (result.get("stage_seconds") or {}).items())
        parts += [f"- time: {result['seconds']:.0f}s ({stages})"]
    parts += [""]
    if result.get("tuning"):
        parts += ["## Tuning on the val split", "", render_tuning(result["tuning"])]
    if result.get("tuning_only"):
        parts += ["Table 2 was not trained (experiment.tuning.only); next: " + str(result.get("next", "")), ""]
    else:
        parts += ["## Table 2", "", "Metrics x 100 except ppl.; ΔC % is relative, Δcls. in points.", "",
                  render_table2(rows), render_summary(table2_summary(rows))]
    ablations = result.get("ablations") or {}
    if ablations.get("markdown"):
        parts += ["## Ablations: ERG minus each ablation", "",
                  "Each ablation's pairs come from ERG's candidates and pass the same filters; its captioner trains on "
                  "the original pairs plus as many of them as ERG's pool holds. Deltas are ERG minus the ablation, "
                  "paired by seed, with the 95% t-interval over the seeds (* where it excludes 0).", "",
                  ablations["markdown"]]
    t5 = result.get("table5") or {}
    if t5.get("markdown"):
        parts += [f"## Table 5 ({t5['captioner']}, {', '.join(t5['styles'])})", "", t5["markdown"]]
    f5 = result.get("fig5") or {}
    if f5.get("markdown"):
        parts += [f"## Fig. 5: size ({f5['captioner']}, {', '.join(f5['styles'])})", "", f5["markdown"],
                  "![fig5](fig5_size.png)", ""]
    if f5.get("eps_markdown"):
        parts += [f"## Fig. 5: eps ({f5['captioner']}, {', '.join(f5['styles'])})", "",
                  "Each eps other than extract.eps is an ERG run of its own (same classifiers, the style head "
                  "re-selected at that eps, a generator trained on its phrases); the captioner is trained on the "
                  "original pairs plus that run's augmented pairs.", "", f5["eps_markdown"],
                  *[f"- eps {r['eps']:g}: schema {r['schema']}, generator {r['generator_version']}"
                    + (f", style heads {r['heads']}" if r.get("heads") else "") for r in f5.get("eps_runs", [])],
                  "", "![fig5 eps](fig5_eps.png)", ""]
    parts += ["## Leakage", "", *[f"- {k}: {v}" for k, v in result.get("leakage", {}).items()], ""]
    not_measured = result.get("not_measured") or {}
    parts += ["## Not measured", ""]
    parts += [f"- {k}: {v}" for k, v in not_measured.items()] or ["- (every style was measured)"]
    parts += [""]
    if result.get("modes"):
        parts += ["## Most frequent captions", "", render_modes(result["modes"])]
    samples = result.get("samples") or []
    if samples:
        parts += ["## Samples", "", "| style | captioner | data | image | caption |", "| --- | --- | --- | --- | --- |"]
        parts += [f"| {s['style']} | {s['captioner']} | {s['variant']} | {s['image_id']} | "
                  f"{str(s['hypothesis']).replace('|', '/')} |" for s in samples]
        parts += [""]
    return "\n".join(parts)
