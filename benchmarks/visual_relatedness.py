"""Benchmark: the textual visual context seed's published comparison, reproduced with this project's metrics and
its visual relatedness scorer (:mod:`models.visual_relatedness`), on the COCO Karpathy test split (5,000 images).

Data (``../shared/data``, see its SOURCES.md), aligned line by line with ``coco_karpathy_test/image_ID.txt``:
``textual_visual_context/caption.txt`` (the baseline captioner's best beam), ``Result_tune_BERT_0.4.json`` (the
seed's published visual re-ranker output: BERT-CNN fine-tuned on the dataset at threshold 0.4), the ResNet-152
labels (``visual-context_label.txt``) and their mean top-3 confidence (``visual-context.txt``), and the seed's
Belief Revision files (``LM.txt``: GPT-2 score of each baseline caption; ``Belief-revision.txt``: the score
``LM ** (((1 - sim) / (1 + sim)) ** (1 - P(c)))`` with sim the SBERT (RoBERTa-large STS) cosine between caption
and labels), from which the seed's cosine is recovered exactly: ``r = (log BR / log LM) ** (1 / (1 - P(c)))``,
``sim = (1 - r) / (1 + r)``.

1. ``metrics``: BLEU-1..4, METEOR and CIDEr (pycocoevalcap through :class:`models.caption_metrics.CaptionScorer`,
   PTB-tokenised) of the baseline, of the published re-ranked captions, and of this project's pick between the two
   (the one with the higher MiniLM visual relatedness, the baseline on ties), against the 5 Karpathy references.
2. ``agreement``: this project's re-ranking signal against the published ones: correlation of the MiniLM cosine
   (caption vs labels) with the recovered SBERT cosine, and of the relatedness ``sim ** P(c)`` with the seed's;
   on the images where the published re-ranker changed the caption, how often MiniLM relatedness also prefers the
   published caption.
3. ``margin``: the data behind ``generate.filters.max_relatedness_drop``. For every image, the drop in
   relatedness from one human reference to another of the same image (a faithful rewrite: should pass), and from
   a reference to a reference of another image (drift: should fail); the share passing at each candidate margin;
   and, when an ``augmented_captions`` Delta table is given (``--augmented``), the drop from each factual caption
   to its generated caption.

    python benchmarks/visual_relatedness.py                      # all parts
    python benchmarks/visual_relatedness.py --part metrics

Each part merges its result, with the command that made it, into ``benchmarks/results/visual_relatedness.json``.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

MARGINS = (0.0, 0.02, 0.05, 0.08, 0.1, 0.15, 0.2, 0.25, 0.3)
PARTS = ("metrics", "agreement", "margin")


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").rstrip("\n").split("\n")


def load(data: Path) -> dict:
    """The 5,000 Karpathy test images with references, labels, confidence and the seed's captions and scores."""
    ktest, tvc = data / "coco_karpathy_test", data / "textual_visual_context"
    ids = [line.split("\t")[1].strip() for line in _lines(ktest / "image_ID.txt")]
    refs = list(zip(*[_lines(ktest / f"karpathy-refs-{k}.txt") for k in range(1, 6)]))
    published = {str(r["image_id"]): r["caption"].strip()
                 for r in json.loads((tvc / "Result_tune_BERT_0.4.json").read_text())}
    belief = [line.rsplit(",", 1) for line in _lines(tvc / "Belief-revision.txt")]
    out = {
        "image_id": ids, "references": [list(r) for r in refs],
        "labels": [line.strip() for line in _lines(tvc / "visual-context_label.txt")],
        "confidence": np.array([float(x) for x in _lines(tvc / "visual-context.txt")]),
        "baseline": [line.strip() for line in _lines(tvc / "caption.txt")],
        "published": [published[i] for i in ids],
        "lm": np.array([float(x) for x in _lines(tvc / "LM.txt")]),
        "belief_revision": np.array([float(score) for _, score in belief]),
    }
    n = len(ids)
    lengths = {k: len(v) for k, v in out.items()}
    if any(v != n for v in lengths.values()) or [c for c, _ in belief] != out["baseline"]:
        raise ValueError(f"seed files are not aligned with image_ID.txt: {lengths}")
    return out


def recovered_seed_cosine(lm: np.ndarray, belief_revision: np.ndarray, confidence: np.ndarray) -> np.ndarray:
    """The seed's SBERT cosine between caption and labels, solved from BR = LM ** (((1-s)/(1+s)) ** (1-P))."""
    r = (np.log(belief_revision) / np.log(lm)) ** (1.0 / (1.0 - confidence))
    return (1.0 - r) / (1.0 + r)


def scorer(device: str = "cpu"):
    from models.encoders import SentenceEncoder
    from models.visual_relatedness import VisualRelatednessScorer

    return VisualRelatednessScorer(SentenceEncoder("all-MiniLM-L6-v2", device), "joint", 3, batch_size=128)


def relatedness(vr, captions: list[str], labels: list[str], confidence) -> np.ndarray:
    return vr.score(captions, labels, list(confidence))


def cosine(vr, captions: list[str], labels: list[str]) -> np.ndarray:
    """The plain MiniLM cosine between each caption and its labels (not clipped, no exponent)."""
    vectors = vr._vectors(list(captions) + list(labels))
    return np.array([float(vectors[c] @ vectors[lab]) for c, lab in zip(captions, labels)])


def part_metrics(d: dict, vr) -> dict:
    from models.caption_metrics import ALL_METRICS, CaptionScorer

    base_rel = relatedness(vr, d["baseline"], d["labels"], d["confidence"])
    pub_rel = relatedness(vr, d["published"], d["labels"], d["confidence"])
    ours = [p if pr > br else b for b, p, br, pr in zip(d["baseline"], d["published"], base_rel, pub_rel)]
    refs = dict(zip(d["image_id"], d["references"]))
    systems = {"baseline (caption.txt)": d["baseline"], "published visual re-ranker (Result_tune_BERT_0.4)":
               d["published"], "MiniLM relatedness pick of the two": ours}
    out = {"images": len(d["image_id"]), "metrics": {}}
    with CaptionScorer(ALL_METRICS) as cs:
        for name, captions in systems.items():
            start = time.time()
            out["metrics"][name] = {k: round(v, 4) for k, v in cs.score(refs, dict(zip(d["image_id"], captions))).items()}
            out["metrics"][name]["seconds"] = round(time.time() - start, 1)
    changed = sum(b != p for b, p in zip(d["baseline"], d["published"]))
    out["published_changed_captions"] = changed
    out["ours_picked_published"] = sum(o != b for o, b in zip(ours, d["baseline"]))
    return out


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def part_agreement(d: dict, vr) -> dict:
    conf = d["confidence"]
    seed_cos = recovered_seed_cosine(d["lm"], d["belief_revision"], conf)
    our_cos = cosine(vr, d["baseline"], d["labels"])
    seed_rel = np.clip(seed_cos, 0, 1) ** conf
    base_rel = relatedness(vr, d["baseline"], d["labels"], conf)
    pub_rel = relatedness(vr, d["published"], d["labels"], conf)
    changed = np.array([b != p for b, p in zip(d["baseline"], d["published"])])
    diff = (pub_rel - base_rel)[changed]
    seed_cos_check = np.abs(d["lm"] ** (((1 - seed_cos) / (1 + seed_cos)) ** (1 - conf)) - d["belief_revision"])
    examples = []
    for i in np.flatnonzero(changed)[:8]:
        examples.append({"image_id": d["image_id"][i], "labels": d["labels"][i], "confidence": float(conf[i]),
                         "baseline": d["baseline"][i], "baseline_relatedness": round(float(base_rel[i]), 3),
                         "published": d["published"][i], "published_relatedness": round(float(pub_rel[i]), 3)})
    return {
        "seed_cosine_recovered": {"max_abs_error_of_BR_recomputed": float(seed_cos_check.max()),
                                  "min": round(float(seed_cos.min()), 3), "median": round(float(np.median(seed_cos)), 3),
                                  "max": round(float(seed_cos.max()), 3)},
        "cosine_minilm_vs_seed_sbert": {"pearson": round(float(np.corrcoef(our_cos, seed_cos)[0, 1]), 4),
                                        "spearman": round(_spearman(our_cos, seed_cos), 4),
                                        "minilm_median": round(float(np.median(our_cos)), 3)},
        "relatedness_minilm_vs_seed_sbert": {"spearman": round(_spearman(base_rel, seed_rel), 4)},
        "published_rerank": {
            "changed_images": int(changed.sum()),
            "minilm_prefers_published": int((diff > 0).sum()),
            "minilm_prefers_baseline": int((diff < 0).sum()),
            "ties": int((diff == 0).sum()),
            "agreement": round(float((diff > 0).mean()), 4),
            "mean_relatedness_baseline": round(float(base_rel.mean()), 4),
            "mean_relatedness_published": round(float(pub_rel.mean()), 4),
            "median_gain_where_changed": round(float(np.median(diff)), 4),
        },
        "examples": examples,
    }


def read_delta(path: Path):
    """The live rows of a Delta table folder (add/remove actions of its log replayed; no Spark needed)."""
    import pandas as pd
    import pyarrow.parquet as pq

    live: dict[str, bool] = {}
    for log in sorted(glob.glob(str(path / "_delta_log" / "*.json"))):
        for line in open(log, encoding="utf-8"):
            action = json.loads(line)
            if "add" in action:
                live[action["add"]["path"]] = True
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    return pd.concat([pq.read_table(path / p).to_pandas() for p in live], ignore_index=True) if live else None


def _pass_rates(drops: np.ndarray) -> dict[str, float]:
    return {f"{m:g}": round(float((drops <= m + 1e-12).mean()), 4) for m in MARGINS}


def part_margin(d: dict, vr, augmented: Path | None, seed: int) -> dict:
    n = len(d["image_id"])
    conf = np.asarray(d["confidence"])
    captions = [r for refs in d["references"] for r in refs]
    labels = [lab for lab in d["labels"] for _ in range(5)]
    rel = relatedness(vr, captions, labels, np.repeat(conf, 5)).reshape(n, 5)
    faithful = np.array([rel[i, a] - rel[i, b] for i in range(n) for a in range(5) for b in range(5) if a != b])
    rng = np.random.default_rng(seed)
    other = (np.arange(n) + rng.integers(1, n, size=n)) % n  # another image, never the same one
    foreign = relatedness(vr, [d["references"][j][0] for j in other], d["labels"], conf)
    drift = rel[:, 0] - foreign  # a caption of another image in place of this image's reference
    out = {
        "faithful_pairs": int(len(faithful)), "drift_pairs": int(n),
        "faithful_drop_percentiles": {p: round(float(np.percentile(faithful, q)), 4)
                                      for p, q in (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99))},
        "drift_drop_percentiles": {p: round(float(np.percentile(drift, q)), 4)
                                   for p, q in (("p10", 10), ("p25", 25), ("p50", 50))},
        "pass_rate_faithful": _pass_rates(faithful), "pass_rate_drift": _pass_rates(drift),
    }
    if augmented is not None and (augmented / "_delta_log").is_dir():
        rows = read_delta(augmented)
        by_image = dict(zip((f"coco:{i}" for i in d["image_id"]), range(n)))
        rows = rows[rows["image_id"].isin(by_image)].reset_index(drop=True)
        idx = rows["image_id"].map(by_image).to_numpy()
        labs, cf = [d["labels"][i] for i in idx], conf[idx]
        fact = relatedness(vr, rows["factual_caption"].tolist(), labs, cf)
        gen = relatedness(vr, rows["generated_caption"].fillna("").tolist(), labs, cf)
        aug = fact - gen
        worst = np.argsort(-aug)[:6]
        out["augmented"] = {
            "table": str(augmented), "rows": int(len(rows)),
            "drop_percentiles": {p: round(float(np.percentile(aug, q)), 4)
                                 for p, q in (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99), ("max", 100))},
            "pass_rate": _pass_rates(aug),
            "largest_drops": [{"factual": rows["factual_caption"][i], "generated": rows["generated_caption"][i],
                               "labels": labs[i], "drop": round(float(aug[i]), 3)} for i in worst],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--part", choices=PARTS + ("all",), default="all")
    parser.add_argument("--augmented", type=Path, default=ROOT / ".erg-real" / "warehouse" / "erg" / "augmented_captions",
                        help="an augmented_captions Delta folder for the margin part (skipped when absent)")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "visual_relatedness.json")
    args = parser.parse_args(argv)
    command = "python benchmarks/visual_relatedness.py" + (f" {shlex.join(argv if argv is not None else sys.argv[1:])}"
                                                            if (argv if argv is not None else sys.argv[1:]) else "")
    import torch

    torch.manual_seed(0)
    d = load(args.data)
    vr = scorer()
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    result["scorer"] = {"encoder": "all-MiniLM-L6-v2", "label_mode": "joint", "top_labels": 3,
                        "formula": "clip(cos(caption, labels), 0, 1) ** P(labels)"}
    parts = PARTS if args.part == "all" else (args.part,)
    for part in parts:
        start = time.time()
        if part == "metrics":
            value = part_metrics(d, vr)
        elif part == "agreement":
            value = part_agreement(d, vr)
        else:
            value = part_margin(d, vr, args.augmented, args.seed)
        value["seconds"] = round(time.time() - start, 1)
        value["command"] = command
        result[part] = value
        print(json.dumps({part: value}, indent=2)[:4000], flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
