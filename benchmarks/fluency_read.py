"""A human read of generated captions: is each passing caption fluent English? (the volume issue's fluency bar)

Two steps, on a real-data home after `erg generate --conf conf/shared_data.yaml`:

    ERG_HOME=.erg-real python benchmarks/fluency_read.py sample --per-style 200
    (a reader labels every line of benchmarks/results/fluency_read.jsonl by RUBRIC: "label": "fluent" | "broken")
    python benchmarks/fluency_read.py score

``sample`` draws ``--per-style`` random passing captions per style of the current generator (the lowest hash of
(``--seed``, pair key): random, repeatable) into ``fluency_read.jsonl`` with ``label`` null, and writes the rubric
and the command into ``fluency_read.json``; ``score`` counts the labels per style into ``fluency_read.json`` (the
share fluent, and the bar: at least 90% in every style). The rubric was written before any caption was read.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RUBRIC = """\
fluent: a native speaker would accept the text as an image caption: a grammatical sentence, or a caption-style
noun phrase ("a dog on the beach"), with the style words where a person would put them. Ignored: case,
tokenised punctuation (" ." " ,"), a missing final period, an "a"/"an" slip, a plain but grammatical wording.
Not judged: whether it is true of the image, funny, romantic, positive or negative.
broken: any of
  (a) a word or phrase placed where it breaks the syntax ("the back end of his surfboard expert",
      "looking at a cake off daydreaming");
  (b) a clause or phrase attached with no connector that makes it grammatical ("smile for the camera at night
      their joy");
  (c) a wrong verb form ("trying to rides", "trying fly kick");
  (d) a word doubled or missing so that the sentence is ungrammatical ("a a dog", "a man riding wave");
  (e) modifiers in an impossible order or number ("two smaller nice many boats");
  (f) the same content said twice ("riding a horse trying to ride a horse").
"""
BAR = 0.9
OUT = Path("benchmarks/results/fluency_read")


def sample(args) -> None:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from jobs.platform.config import load_config
    from jobs.platform.model_store import require_current
    from jobs.platform.spark import get_spark
    from jobs.platform.tables import read_table, register_tables

    cfg = load_config(args.conf, ["spark.show_progress=false"])
    spark = get_spark(cfg)
    register_tables(spark, cfg)
    current = require_current(cfg, "generator", "generate")
    rows = (read_table(spark, cfg, "augmented_captions")
            .where((F.col("generator_version") == current["version"]) & F.col("passed")))
    key = F.xxhash64(F.lit(args.seed), "query_id", "scene_id", "retrieval_type")
    ranked = rows.withColumn("_n", F.row_number().over(Window.partitionBy("style").orderBy(key)))
    picked = (ranked.where(F.col("_n") <= args.per_style)
              .select("style", "_n", "query_id", "scene_id", "retrieval_type", "factual_caption", "transfer_phrase",
                      "generated_caption", "fluency").orderBy("style", "_n").collect())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.with_suffix(".jsonl").open("w") as handle:
        for r in picked:
            handle.write(json.dumps({"id": f"{r['style']}-{r['_n']:03d}", "style": r["style"],
                                     "generated_caption": r["generated_caption"],
                                     "factual_caption": r["factual_caption"], "transfer_phrase": r["transfer_phrase"],
                                     "fluency": r["fluency"], "label": None}) + "\n")
    meta = {"command": "ERG_HOME=" + os.environ.get("ERG_HOME", ".erg") + " python "
            + " ".join(shlex.quote(a) for a in sys.argv), "generator_version": current["version"],
            "per_style": args.per_style, "seed": args.seed, "rubric": RUBRIC, "bar": BAR}
    out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{len(picked)} captions to label in {out.with_suffix('.jsonl')}")


def filter_score_agreement(lines: list[dict]) -> dict:
    """How well the fluency filter's score (``fluency``, every caption read passed it) tells the reader's labels
    apart: the AUC (the chance that a fluent caption scores above a broken one, ties half) and, at stricter
    thresholds, the share of the read it would keep and the fluent share among those."""
    fluent = [r["fluency"] for r in lines if r["label"] == "fluent"]
    broken = [r["fluency"] for r in lines if r["label"] == "broken"]
    auc = (sum((f > b) + 0.5 * (f == b) for f in fluent for b in broken) / (len(fluent) * len(broken))
           if fluent and broken else None)
    stricter = {}
    for threshold in (0.6, 0.7, 0.8):
        kept_fluent, kept_broken = sum(f >= threshold for f in fluent), sum(b >= threshold for b in broken)
        kept = kept_fluent + kept_broken
        stricter[str(threshold)] = {"kept_share": kept / len(lines),
                                    "share_fluent": kept_fluent / kept if kept else None}
    return {"auc": auc, "at_threshold": stricter}


def score(args) -> None:
    out = Path(args.out)
    lines = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines() if line.strip()]
    unlabelled = [r["id"] for r in lines if r.get("label") not in ("fluent", "broken")]
    if unlabelled:
        raise SystemExit(f"{len(unlabelled)} captions have no label (fluent / broken), e.g. {unlabelled[:3]}")
    meta = json.loads(out.with_suffix(".json").read_text())
    styles = {}
    for r in lines:
        s = styles.setdefault(r["style"], {"read": 0, "fluent": 0})
        s["read"] += 1
        s["fluent"] += r["label"] == "fluent"
    for style, s in styles.items():
        s["share_fluent"] = s["fluent"] / s["read"]
        s["meets_bar"] = s["share_fluent"] >= BAR
        s["filter_score"] = filter_score_agreement([r for r in lines if r["style"] == style])
    meta.update({"score_command": "python " + " ".join(shlex.quote(a) for a in sys.argv), "styles": styles,
                 "meets_bar_every_style": all(s["meets_bar"] for s in styles.values())})
    out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(styles, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["sample", "score"])
    parser.add_argument("--conf", default="conf/shared_data.yaml")
    parser.add_argument("--per-style", type=int, default=200)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    (sample if args.step == "sample" else score)(args)


if __name__ == "__main__":
    main()
