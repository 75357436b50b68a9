"""Benchmark of the Extract step on real data (no Spark): classifier accuracy, selected head, phrase quality.

Data (/work/shared/data, see its SOURCES.md): FlickrStyle10K humor and romantic captions with the five Flickr30K
factual captions of each of their 7,000 images; SentiCap positive/negative captions (COCO val2014 images) with its
train/test split; the COCO Karpathy test references, which give factual captions for the SentiCap test images that
lie in the Karpathy test split. The classifier (MiniLM by default) is fine-tuned on [factual, humor, romantic,
positive, negative]; factual training captions come half from Flickr30K, half from COCO, so that "factual" is not
learnable as "Flickr". FlickrStyle images are split by image (held-out images are never trained on).

Reported: held-out accuracy per class; the head (l_s, h_s) chosen by Eq. 2 on training stylized captions; and
micro precision/recall/F1 of the extracted phrase words against the gold added words (words of the stylized
caption absent from all factual captions of its image, :mod:`models.phrase_eval`) on held-out captions, next to
the random and the two lexicon baselines (salience, c-TF-IDF) with the same phrase size. For SentiCap it also
scores against the dataset's own per-word sentiment annotation (``word_sentiment``), a second gold. Prints a table
and writes ``extract_quality.json`` (plus the Table 4 view and the confidence heatmap) to ``--out``.

    python benchmarks/extract_quality.py --data /work/shared/data --threads 1
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from models.importance_render import confidence_heatmap_png, importance_html, importance_png  # noqa: E402
from models.phrase_eval import (StyleLexicon, gold_added_mask, random_phrase_masks,  # noqa: E402
                                score_phrase_masks)
from models.style_classifier import fine_tune, load_style_classifier  # noqa: E402
from models.style_phrases import extract_style_phrases, select_style_head  # noqa: E402

LABELS = ["factual", "humor", "romantic", "positive", "negative"]
NEEDED = ["flickrstyle10k/funny_train.txt", "flickrstyle10k/romantic_train.txt",
          "flickrstyle10k/image_names_humor.txt", "flickrstyle10k/factual_train.txt", "senticap/senticap.json",
          "coco_karpathy_test/image_ID.txt", "coco_karpathy_test/karpathy-refs-1.txt"]


def _lines(path: Path, encoding: str = "utf-8") -> list[str]:
    return [line.rstrip("\r\n") for line in path.read_text(encoding=encoding).splitlines()]


def load_flickrstyle(root: Path) -> tuple[list[str], dict[str, list[str]], dict[str, list[str]]]:
    """Image ids, {style: captions aligned with the ids}, {image id: Flickr30K factual captions}."""
    folder = root / "flickrstyle10k"
    images = [name.removesuffix(".jpg") for name in _lines(folder / "image_names_humor.txt")]
    stylized = {"humor": _lines(folder / "funny_train.txt"),
                "romantic": _lines(folder / "romantic_train.txt", encoding="latin-1")}
    for style, captions in stylized.items():
        if len(captions) != len(images):
            raise ValueError(f"{style}: {len(captions)} captions for {len(images)} images")
    factual: dict[str, list[str]] = defaultdict(list)
    for line in _lines(folder / "factual_train.txt"):
        key, caption = line.split("\t", 1)
        factual[key.split(".jpg#")[0]].append(caption)
    return images, stylized, factual


def load_senticap(root: Path) -> list[dict]:
    """SentiCap sentences: filename, split, style (positive/negative), raw caption, annotated sentiment words."""
    data = json.loads((root / "senticap" / "senticap.json").read_text())
    rows = []
    for image in data["images"]:
        for sentence in image["sentences"]:
            sentiment_words = {token.lower() for token, flag in zip(sentence["tokens"], sentence["word_sentiment"])
                               if flag}
            rows.append({"filename": image["filename"], "split": image["split"], "caption": sentence["raw"],
                         "style": "positive" if sentence["sentiment"] == 1 else "negative",
                         "sentiment_words": sentiment_words})
    return rows


def load_coco_refs(root: Path) -> dict[str, list[str]]:
    """COCO Karpathy test filename -> its five reference captions."""
    folder = root / "coco_karpathy_test"
    names = [line.split("\t")[0] for line in _lines(folder / "image_ID.txt")]
    refs: dict[str, list[str]] = defaultdict(list)
    for k in range(1, 6):
        for name, caption in zip(names, _lines(folder / f"karpathy-refs-{k}.txt")):
            refs[name].append(caption)
    return refs


def build_sets(root: Path, args: argparse.Namespace) -> dict:
    """Training, held-out accuracy and phrase-evaluation sets, all seeded."""
    rng = np.random.default_rng(args.seed)
    images, stylized, flickr_factual = load_flickrstyle(root)
    senticap = load_senticap(root)
    coco_refs = load_coco_refs(root)
    order = rng.permutation(len(images))
    test_images, train_images = order[:args.test_images], order[args.test_images:]
    n, n_test = args.train_per_class, args.test_per_class

    def pick(items: list, size: int) -> list:
        return [items[index] for index in sorted(rng.choice(len(items), size=min(size, len(items)), replace=False))]

    train, test = [], []
    for style in ("humor", "romantic"):
        train += [(stylized[style][i], style) for i in pick(list(train_images), n)]
        test += [(stylized[style][i], style) for i in pick(list(test_images), n_test)]
    senti_test_images = {row["filename"] for row in senticap if row["split"] == "test"}
    for style in ("positive", "negative"):
        train += [(row["caption"], style) for row in pick([r for r in senticap if r["split"] != "test" and
                                                           r["style"] == style], n)]
        test += [(row["caption"], style) for row in pick([r for r in senticap if r["split"] == "test" and
                                                          r["style"] == style], n_test)]
    coco_train_names = [name for name in coco_refs if name not in senti_test_images]
    coco_order = rng.permutation(len(coco_train_names))
    half, half_test = n // 2, n_test // 2
    train += [(flickr_factual[images[i]][int(rng.integers(5))], "factual") for i in pick(list(train_images), half)]
    train += [(coco_refs[coco_train_names[i]][int(rng.integers(5))], "factual") for i in coco_order[:n - half]]
    test += [(flickr_factual[images[i]][int(rng.integers(5))], "factual") for i in pick(list(test_images), half_test)]
    test += [(coco_refs[coco_train_names[i]][int(rng.integers(5))], "factual")
             for i in coco_order[n - half:n - half + n_test - half_test]]
    phrase_eval = [{"caption": stylized[style][i], "style": style, "source": "flickrstyle10k",
                    "factual": flickr_factual[images[i]]} for i in test_images for style in ("humor", "romantic")]
    phrase_eval += [{"caption": row["caption"], "style": row["style"], "source": "senticap",
                     "factual": coco_refs[row["filename"]], "sentiment_words": row["sentiment_words"]}
                    for row in senticap if row["split"] == "test" and row["filename"] in coco_refs]
    return {"train": train, "test": test, "phrase_eval": phrase_eval,
            "lexicon_factual": [caption for caption, label in train if label == "factual"]}


def phrase_table(records: list, items: list[dict], lexicons: dict[str, StyleLexicon], eps: float,
                 seed: int) -> dict:
    """P/R/F1 of extractor, random and lexicon phrases, overall and per source and style, per gold."""
    tokens = [record.tokens for record in records]
    styles = [item["style"] for item in items]
    predictions = {"extractor (l_s, h_s)": [record.phrase_mask for record in records],
                   "random": random_phrase_masks(tokens, eps, seed),
                   **{f"{name} lexicon": lexicon.phrase_masks(tokens, styles, eps)
                      for name, lexicon in lexicons.items()}}
    added = [gold_added_mask(words, item["factual"]) for words, item in zip(tokens, items)]
    groups: dict[str, list[int]] = defaultdict(list)
    for index, item in enumerate(items):
        for group in ("all", item["source"], item["style"]):
            groups[group].append(index)
    table: dict = {"added_words": {}, "senticap_sentiment_words": {}}
    for group, rows in groups.items():
        table["added_words"][group] = {method: score_phrase_masks([masks[i] for i in rows],
                                                                  [added[i] for i in rows]).to_dict()
                                       for method, masks in predictions.items()}
    senti_rows = [index for index, item in enumerate(items) if "sentiment_words" in item]
    sentiment_gold = {index: [word in items[index]["sentiment_words"] for word in tokens[index]]
                      for index in senti_rows}
    table["senticap_sentiment_words"]["senticap"] = {
        method: score_phrase_masks([masks[i] for i in senti_rows], [sentiment_gold[i] for i in senti_rows]).to_dict()
        for method, masks in predictions.items()}
    return table


def print_report(result: dict) -> None:
    """The benchmark's table on stdout."""
    accuracy = result["accuracy"]
    print(f"\nheld-out accuracy (n={accuracy['n']}): {accuracy['accuracy']:.3f}")
    for label in LABELS:
        print(f"  {label:<9} {accuracy[f'accuracy/{label}']:.3f}  (n={accuracy[f'n/{label}']})")
    head = result["head_selection"]
    print(f"\nselected head (l_s, h_s) = ({head['layer']}, {head['head']}) over {head['n_captions']} captions, "
          f"mean confidence {head['confidence'][head['layer']][head['head']]:.3f} "
          f"(median over heads {float(np.median(head['confidence'])):.3f})")
    for gold, groups in result["phrases"].items():
        print(f"\nphrase words vs gold {gold} (micro P / R / F1)")
        print(f"  {'group':<16}{'method':<24}{'P':>7}{'R':>7}{'F1':>7}{'pred':>7}{'gold':>7}")
        for group, methods in groups.items():
            for method, s in methods.items():
                print(f"  {group:<16}{method:<24}{s['precision']:7.3f}{s['recall']:7.3f}{s['f1']:7.3f}"
                      f"{s['n_predicted']:7d}{s['n_gold']:7d}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit code (0 also when the data is absent and the run is skipped)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.environ.get("ERG_SHARED_DATA", "/work/shared/data"))
    parser.add_argument("--model", default="all-MiniLM-L6-v2", help="classifier backbone: name or path")
    parser.add_argument("--out", default=".erg/benchmarks/extract_quality", help="folder for json and figures")
    parser.add_argument("--train-per-class", type=int, default=400)
    parser.add_argument("--test-per-class", type=int, default=150)
    parser.add_argument("--test-images", type=int, default=300, help="held-out FlickrStyle images")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--max-length", type=int, default=48)
    parser.add_argument("--eps", type=float, default=0.25)
    parser.add_argument("--selection-captions", type=int, default=200)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (1 on a busy machine)")
    args = parser.parse_args(argv)
    root = Path(args.data)
    missing = [name for name in NEEDED if not (root / name).exists()]
    if missing:
        print(f"SKIP: the caption data is absent under {root} (missing {', '.join(missing)})")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    timings, started = {}, time.perf_counter()
    sets = build_sets(root, args)
    clf = load_style_classifier(args.model, LABELS, device=args.device, max_length=args.max_length)
    texts, labels = zip(*sets["train"])
    losses: list[float] = []
    tick = time.perf_counter()
    fine_tune(clf, list(texts), list(labels), epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
              seed=args.seed, on_step=lambda step, metrics: losses.append(metrics["loss"]))
    timings["fine_tune_s"] = time.perf_counter() - tick
    test_texts, test_labels = zip(*sets["test"])
    accuracy = clf.evaluate(list(test_texts), list(test_labels))
    stylized_train = [(caption, label) for caption, label in sets["train"] if label != "factual"]
    tick = time.perf_counter()
    selection = select_style_head(clf, [c for c, _ in stylized_train], [s for _, s in stylized_train], args.eps,
                                  max_captions=args.selection_captions, seed=args.seed)
    timings["head_selection_s"] = time.perf_counter() - tick
    items = sets["phrase_eval"]
    tick = time.perf_counter()
    records = extract_style_phrases(clf, [item["caption"] for item in items], selection.layer, selection.head,
                                    args.eps)
    timings["extract_s"] = time.perf_counter() - tick
    lexicons = {scoring: StyleLexicon.fit([c for c, _ in stylized_train], [s for _, s in stylized_train],
                                          sets["lexicon_factual"], scoring=scoring)
                for scoring in ("salience", "ctfidf")}
    phrases = phrase_table(records, items, lexicons, args.eps, args.seed)
    timings["total_s"] = time.perf_counter() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    styles = [item["style"] for item in items]
    (out / "table4.html").write_text(importance_html(records, styles, per_style=4))
    importance_png(records, styles, out / "table4.png", per_style=4)
    confidence_heatmap_png(selection.confidence, (selection.layer, selection.head), out / "confidence_heatmap.png")
    result = {"args": vars(args), "n_train": len(sets["train"]), "n_test": len(sets["test"]),
              "n_phrase_eval": len(items), "train_loss_first_last": [losses[0], float(np.mean(losses[-10:]))],
              "accuracy": accuracy, "head_selection": selection.to_dict(), "phrases": phrases,
              "samples": [{"style": item["style"], **record.to_dict()} for item, record in
                          list(zip(items, records))[:: max(1, len(items) // 12)]],
              "timings": timings, "device": str(clf.device), "torch_threads": torch.get_num_threads()}
    (out / "extract_quality.json").write_text(json.dumps(result, indent=2))
    print_report(result)
    print("\ntimings: " + ", ".join(f"{key} {value:.0f}" for key, value in timings.items()))
    print(f"wrote {out / 'extract_quality.json'}, table4.html, table4.png, confidence_heatmap.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
