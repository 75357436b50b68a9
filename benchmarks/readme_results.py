"""The README's results summary, rendered from ``benchmarks/results/*.json``.

The block between ``<!-- results:begin -->`` and ``<!-- results:end -->`` in README.md is this script's output;
after a benchmark writes new results, regenerate it with

    python benchmarks/readme_results.py            # rewrite the block in README.md
    python benchmarks/readme_results.py --check    # exit 1 when README.md's block is out of date
    python benchmarks/readme_results.py --print    # print the block only

Each line comes from one results file (``table2.json``, ``generator_quality.json``, ``volume.json``, ``scale.json``,
``extract_speed.json``, ``chaos.json``, ``style_classifiers.json``); a file that is missing, or lacks what a line
needs, leaves its line out.
The full record, one section per benchmark, is ``benchmarks/README.md``.
"""
from __future__ import annotations

import argparse
import json
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
STYLES = ("humor", "romantic", "positive", "negative")


def _load(results: Path, name: str) -> dict[str, Any] | None:
    try:
        data = json.loads((results / name).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _f3(value: float) -> str:
    """Three decimals, halves rounded up as written (0.8855 -> 0.886, not the binary float's 0.885)."""
    return str(Decimal(repr(value)).quantize(Decimal("0.001"), rounding=ROUND_HALF_UP))


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def _style_order(styles) -> list[str]:
    """``styles`` in the paper's order (:data:`STYLES`), any other after them by name."""
    return [s for s in STYLES if s in styles] + sorted(s for s in styles if s not in STYLES)


def _signed(value: float) -> str:
    return f"{value:+.1f}"


def table2_lines(results: Path) -> list[str]:
    """Table 2 on the real corpora: per style x captioner, C and cls. original -> augmented, and the summary."""
    data = _load(results, "table2.json")
    if not data or not data.get("rows"):
        return []
    rows = {(r["style"], r["captioner"], r["variant"]): r for r in data["rows"]}
    cells = [(s, c) for (s, c, v) in rows if v == "augmented" and (s, c, "original") in rows]
    if not cells:
        return []
    order = {s: i for i, s in enumerate(STYLES)}
    cells.sort(key=lambda sc: (order.get(sc[0], len(order)), sc[0], sc[1]))
    lines = ["Paper Table 2 on the real corpora (`table2.json`; metrics x 100, original -> augmented training data):",
             "", "| style | captioner | CIDEr | cls. | cls. (indep.) |", "| --- | --- | ---: | ---: | ---: |"]
    for style, captioner in cells:
        before, after = rows[(style, captioner, "original")], rows[(style, captioner, "augmented")]
        cols = []
        for key in ("cider", "cls", "cls_independent"):
            if key in before and key in after:
                cols.append(f"{_pct(before[key])} -> {_pct(after[key])}")
            else:
                cols.append("-")
        lines.append(f"| {style} | {captioner} | " + " | ".join(cols) + " |")
    summary = data.get("summary") or {}
    parts = []
    if {"cells", "cls_up", "cider_up"} <= summary.keys():
        parts.append(f"cls. rises in {summary['cls_up']} of {summary['cells']} cells, CIDEr in {summary['cider_up']}")
    by_style = summary.get("cls_by_style") or {}
    if by_style:
        parts.append("cls. per style over its captioners: " + ", ".join(
            f"{s} {_signed(v['delta'])}" for s, v in by_style.items() if isinstance(v, dict) and "delta" in v))
    leakage = data.get("leakage") or {}
    if leakage:
        parts.append("leakage counts all 0" if not any(leakage.values())
                     else f"leakage counts {sum(leakage.values())} (not 0)")
    if parts:
        lines += ["", "; ".join(parts) + "."]
    return lines


def generator_lines(results: Path) -> list[str]:
    data = _load(results, "generator_quality.json")
    generators = (data or {}).get("generators") or {}
    default = (data or {}).get("default")
    best = generators.get(default)
    if not best or "pass_rate" not in best:
        return []
    text = (f"- Generator (`generator_quality.json`): the default `{default}` passes every filter on "
            f"{best['pass_rate']:.3f} of {data.get('candidates', '?'):,} real candidates")
    graft = generators.get("graft")
    if graft and "pass_rate" in graft:
        text += f" (the graft baseline {graft['pass_rate']:.3f})"
    details = [f"{label} {best[key]:.3f}" for key, label in
               (("nonword_rate", "non-words"), ("repeated_trigram_rate", "repeated trigrams"),
                ("content_recall", "content recall")) if key in best]
    if details:
        text += "; " + ", ".join(details)
    if "meets_bar" in best:
        text += "; it " + ("meets" if best["meets_bar"] else "misses") + " the bar"
    volume = _load(results, "generator_quality_volume.json") or {}
    at_volume = volume.get(default) or {}
    if "pass_rate" in at_volume:
        text += (f". At volume (`generator_quality_volume.json`, {volume['measured_candidates']:,} of the "
                 f"{volume['run_candidates']:,} candidates of the real-data run): "
                 f"pass rate {at_volume['pass_rate']:.3f}, "
                 f"repeated trigrams {at_volume['repeated_trigram_rate']:.3f}, content recall "
                 f"{at_volume['content_recall']:.3f}, phrase uptake {at_volume['phrase_uptake']:.3f}; it "
                 + ("meets" if at_volume.get("meets_bar") else "misses") + " the bar")
    return [text + "."]


def volume_lines(results: Path) -> list[str]:
    data = _load(results, "volume.json")
    styles = (data or {}).get("styles") or {}
    hits = {s: v["all"]["hits"] for s, v in styles.items() if isinstance(v, dict) and "hits" in (v.get("all") or {})}
    if not hits:
        return []
    order = _style_order(hits)
    text = ("- Yield (`volume.json`): retrieval hits per style on the real corpora, each a generation candidate: "
            + ", ".join(f"{s} {hits[s]:,}" for s in order) + f" ({sum(hits.values()):,} in all)")
    passed = {s: styles[s]["all"].get("passed") for s in order}
    if any(passed.values()):
        text += "; passing pairs " + ", ".join(f"{s} {passed[s] or 0:,}" for s in order)
    return [text + "."]


def volume_table2_lines(results: Path) -> list[str]:
    data = _load(results, "table2_volume_nic/table2.json") or {}
    rows = [r for r in data.get("rows") or [] if r.get("variant") == "augmented" and "delta_cls" in r]
    if not rows:
        return []

    def seeds(row: dict) -> int:  # the augmented cell's decodes, one per seed
        return sum(m["style"] == row["style"] and m["captioner"] == row["captioner"]
                   and m["variant"].startswith("augmented#") for m in data.get("modes") or [])

    text = ("- Table 2 at volume (`table2_volume_nic/table2.json`; mean over the seeds, 95% intervals in its "
            "table2.md): " + "; ".join(
                f"{r['style']} {r['captioner']} ({seeds(r)} seeds, {r['train_pairs_augmented']:,} augmented pairs) "
                f"Δcls. {_signed(r['delta_cls'])}, ΔC of the means {_signed(r['delta_cider_percent'])}%"
                for r in rows))
    return [text + "."]


def fluency_lines(results: Path) -> list[str]:
    data = _load(results, "fluency_read.json")
    styles = (data or {}).get("styles") or {}
    shares = {s: v["share_fluent"] for s, v in styles.items() if isinstance(v, dict) and "share_fluent" in v}
    if not shares:
        return []
    order = _style_order(shares)
    read = sum(styles[s]["read"] for s in order)
    text = (f"- Fluency (`fluency_read.json`): of {read:,} random passing captions read by a rubric written before "
            "reading, fluent: " + ", ".join(f"{s} {_pct(shares[s])}%" for s in order))
    bar = data.get("bar")
    if bar is not None:
        text += f" ({'every style meets' if data.get('meets_bar_every_style') else 'below'} the {_pct(bar)}% bar)"
    return [text + "."]


#: erg sql --engine values as the README names them
ENGINE_NAMES = {"auto": "DuckDB", "spark": "Spark"}


def safety_lines(results: Path) -> list[str]:
    data = _load(results, "safety.json") or {}
    lines = []
    speed = data.get("sql_speed") or {}
    if speed.get("auto") and speed.get("spark"):
        lines.append(f"- SQL (`safety.json`): `erg sql` answers the query above on the real-data home in "
                     f"{speed['auto']['median_seconds']:.1f} s without Spark (DuckDB over the Delta tables), "
                     f"{speed['spark']['median_seconds']:.0f} s through Spark in the same run"
                     + (", the same rows." if speed.get("same_rows") else "; the rows differ."))
    engines = (data.get("sql_refusals") or {}).get("engines") or {}
    if engines:
        tried = {name: e["tried"] for name, e in engines.items()}
        refused = {name: e["refused"] for name, e in engines.items()}
        unchanged = data["sql_refusals"].get("tables_unchanged")
        lines.append("- Read-only SQL (`safety.json`): write statements refused, of those tried: "
                     + ", ".join(f"{refused[n]} of {tried[n]} on the {ENGINE_NAMES.get(n, n)} path" for n in engines)
                     + ("; every table unchanged." if unchanged else "; a table CHANGED."))
    runs = data.get("concurrency") or {}
    if runs.get("runs"):
        ran = [n for n, r in runs["runs"].items() if r["rc"] == 0]
        same = (runs.get("tables_vs_serial_run") or {}).get("identical")
        lines.append(f"- Concurrency (`safety.json`): {len(runs['runs'])} writing runs started together on one home: "
                     f"{len(ran)} ran, {len(runs.get('refused') or [])} refused (exit 2, naming the holder); tables "
                     + ("identical to a serial run's." if same else "DIFFER from a serial run's."))
    restore = data.get("restore") or {}
    if restore.get("steps"):
        back = (restore.get("after_restore_vs_first_run") or {}).get("identical")
        rerun = (restore.get("after_incremental_vs_run_without_bad_file") or {}).get("identical")
        lines.append("- Restore (`safety.json`): after a bad delivery and a run over it, `erg restore --run` put back "
                     + ("every table as the first run left it" if back else "tables that DIFFER from the first run's")
                     + "; the incremental rerun then "
                     + ("equals a run that never saw the bad file." if rerun else "DIFFERS from a clean run."))
    return lines


def scale_lines(results: Path) -> list[str]:
    data = _load(results, "scale.json")
    if not data:
        return []
    lines = []
    sizes = data.get("sizes") or {}
    top = max(sizes, key=int, default=None)
    inc = data.get("incremental") or {}
    if top is not None and {"ingest_s", "embed_s", "retrieve_s"} <= sizes[top].keys():
        run = sizes[top]
        where = f"; {data['cluster']}" if data.get("cluster") else ""
        text = (f"- Scale (`scale.json`{where}): {int(top):,} factual captions ingested, embedded and retrieved in "
                f"{run['ingest_s']:,.0f} / {run['embed_s']:,.0f} / {run['retrieve_s']:,.0f} s")
        if "ratio" in inc and "size" in inc:
            text += (f"; an incremental run over 1% new rows at {int(inc['size']):,} takes {inc['ratio']:.3f} of "
                     "the full run's time")
        lines.append(text + ".")
    embed, gen = data.get("embed") or {}, data.get("generate") or {}
    parts = []
    if {"udf_items_per_s", "udf_share_of_matmul_peak"} <= embed.keys():
        parts.append(f"the embed UDF encodes {embed['udf_items_per_s']:,.0f} captions/s, "
                     f"{embed['udf_share_of_matmul_peak']:.0%} of the machine's fp32 matmul peak")
    if {"udf_captions_per_s", "speedup_vs_plain_path"} <= gen.keys():
        text = (f"the generator UDF writes {gen['udf_captions_per_s']:,.1f} captions/s, "
                f"{gen['speedup_vs_plain_path']:.2f}x its plain decoding path")
        if gen.get("same_text_share") is not None:
            text += (", every caption the same" if gen["same_text_share"] == 1.0
                     else f", {gen['same_text_share']:.1%} of captions the same")
        parts.append(text)
    parts += extract_speed_part(results)
    if parts:
        lines.append("- Speed (`scale.json`): " + "; ".join(parts) + ".")
    real = data.get("retrieval_real") or {}
    auto = real.get("auto") or {}
    if {"scenes", "queries", "recall_at_10", "speedup_vs_exact"} <= real.keys() and "index_type" in auto:
        kind = {"hnsw": "HNSW", "hnsw_sq8": "HNSW-SQ8", "ivf": "IVF", "flat": "exact search"}.get(
            auto["index_type"], auto["index_type"])
        text = (f"- Retrieval (`scale.json`, real MiniLM vectors): over {real['scenes']:,} scenes x "
                f"{real['queries']:,} queries, `retrieve.index.type: auto` chose {kind} "
                f"({auto.get('search_param', 'none')}): recall@10 {real['recall_at_10']:.3f} at "
                f"{real['speedup_vs_exact']:.1f}x exact search")
        turns = real.get("interleaved") or {}
        if "speedup_vs_exact" in turns:
            text += f" ({turns['speedup_vs_exact']:.1f}x timed in turn with it on {turns['queries']:,} queries)"
        lines.append(text + ".")
    return lines


def extract_speed_part(results: Path) -> list[str]:
    """The Speed line's part for ``extract_speed.json`` (none where it is missing)."""
    data = _load(results, "extract_speed.json")
    new = ((data or {}).get("summary") or {}).get("new") or {}
    if not {"speedup", "seconds_old", "seconds", "max_abs_val_accuracy_delta"} <= new.keys():
        return []
    heads = new.get("heads") or {}
    return [f"extract's classifier fits and head selection on the real corpora take {new['seconds']:,.0f} s instead "
            f"of {new['seconds_old']:,.0f} s ({new['speedup']:.2f}x, `extract_speed.json`), val accuracy within "
            f"{new['max_abs_val_accuracy_delta']:.3f} per style, {sum(h['same'] for h in heads.values())} of "
            f"{len(heads)} style heads the same"]


def chaos_lines(results: Path) -> list[str]:
    data = _load(results, "chaos.json")
    if not data or "kills" not in data or "identical" not in data:
        return []
    per_stage = data.get("kills_per_stage") or {}
    stages = (", ".join(f"{s} {n}" for s, n in per_stage.items() if n) if per_stage
              else ", ".join(data.get("stages_hit") or []))
    registry = ("" if "registry_aliases_broken" not in data
                else f"; registry aliases naming a half-written model: {data['registry_aliases_broken']}")
    experiment = bool(per_stage.get("experiment"))
    return [f"- Kills (`chaos.json`): SIGKILLed {data['kills']} times" + (f" (in {stages})" if stages else "")
            + ", then rerun (`erg run --incremental`" + ("; `erg experiment` again" if experiment else "")
            + f"): {data['identical']} of {data['kills']} reruns left every table "
            + ("and cell " if experiment else "") + f"equal to an uninterrupted run's{registry}."]


def classifier_lines(results: Path) -> list[str]:
    data = _load(results, "style_classifiers.json")
    if not data:
        return []
    by_kind: dict[str, dict[str, float]] = {}
    for part_name, part in (data.get("evaluation_classifiers") or {}).items():
        kind = part_name.split(":")[0]
        for style, got in ((part or {}).get("styles") or {}).items():
            if isinstance(got, dict) and "accuracy" in got:
                by_kind.setdefault(kind, {})[style] = got["accuracy"]
    if not by_kind:
        return []

    def listed(accuracy: dict[str, float]) -> str:
        order = _style_order(accuracy)
        return ", ".join(f"{s} {_f3(accuracy[s])}" for s in order)

    text = "- Evaluation classifiers (`style_classifiers.json`), test accuracy: " + "; ".join(
        f"{kind} {listed(accuracy)}" for kind, accuracy in by_kind.items())
    paper = data.get("paper_accuracy") or {}
    if paper:
        text += f"; the paper {listed(paper)}"
    return [text + "."]


SECTIONS: tuple[Callable[[Path], list[str]], ...] = (table2_lines, volume_table2_lines, generator_lines, volume_lines,
                                                      fluency_lines, scale_lines, chaos_lines, safety_lines,
                                                      classifier_lines)


def render(results: Path = RESULTS) -> str:
    """The block's inner markdown (without the markers)."""
    lines = ["<!-- generated by `python benchmarks/readme_results.py` from benchmarks/results/*.json: edit those, "
             "not this -->"]
    table, bullets = table2_lines(results), []
    for section in SECTIONS[1:]:
        bullets += section(results)
    if table:
        lines += [""] + table
    if bullets:
        lines += [""] + bullets
    if not table and not bullets:
        lines += ["", "(no results in benchmarks/results yet)"]
    return "\n".join(lines) + "\n"


def replace_block(text: str, block: str) -> str:
    """``text`` with what lies between the markers replaced by ``block``; ValueError without both markers."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README has no {BEGIN} ... {END} block")
    return text[:start + len(BEGIN)] + "\n" + block + text[end:]


def current_block(text: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README has no {BEGIN} ... {END} block")
    return text[start + len(BEGIN):end].removeprefix("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when README.md's block is out of date")
    mode.add_argument("--print", dest="print_only", action="store_true", help="print the block, write nothing")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--readme", type=Path, default=README)
    args = parser.parse_args(argv)
    block = render(args.results)
    if args.print_only:
        sys.stdout.write(block)
        return 0
    text = args.readme.read_text()
    if args.check:
        if current_block(text) != block:
            print(f"{args.readme} results block is out of date: run python benchmarks/readme_results.py",
                  file=sys.stderr)
            return 1
        return 0
    updated = replace_block(text, block)
    if updated != text:
        args.readme.write_text(updated)
        print(f"rewrote the results block of {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
