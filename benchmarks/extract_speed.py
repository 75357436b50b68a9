"""Benchmark: extract's fine-tuning, old code path vs new, in one run on the real corpora (no Spark).

What ``erg extract`` fits on ``conf/shared_data.yaml``: the FlickrStyle10K and SentiCap extractor classifiers
(3 epochs each over their sets' train captions) with their style heads (Eq. 2 over ``head_selection_captions``
train captions), and the four per-style evaluation classifiers (style vs factual, 1 epoch). Each is run by the
``models/`` code of two trees: ``--base`` (a commit, default the one before the speed work: random batches, AdamW's
per-parameter loop) and the working tree (length-bucketed batches, fused AdamW), in separate processes, alternating
old/new/new/old so that a drift of the host's speed weighs on both. The settings are the conf's, passed to both
trees the same; each tree's defaults decide the rest. Reports seconds per part, the speedup of the three fits plus
head selection together, val accuracy per style (the bar: within 0.01), and the heads chosen (the bar: the same
head, or one whose Eq. 2 score is within 1%).

    python benchmarks/extract_speed.py --threads 2

Splits as ``benchmarks/style_classifiers.py`` builds them (the paper's protocol, as ``erg ingest`` does).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]

BASE = "1f628b4"  # main before the speed work
PARTS = ("set:flickrstyle", "set:senticap", "evaluation")
VARIANTS = ("old", "new", "new_bf16", "old_next_seed")  # each variant: (tree, fine_tune options)


# --------------------------------------------------------------------------------------------------- child side
def _child(args) -> dict:
    """One part with the ``models/`` of ``args.tree``: fit seconds, val accuracy, (set parts) the head chosen."""
    sys.path[:0] = [args.tree, str(ROOT)]
    import numpy as np
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    import models.style_classifier as style_classifier

    assert Path(style_classifier.__file__).resolve().is_relative_to(Path(args.tree).resolve()), style_classifier.__file__
    from benchmarks.style_classifiers import build, test_negatives
    from models.style_classifier import fine_tune, load_style_classifier

    settings = json.loads(args.settings)
    data = build(Path(args.data), settings["split_seed"])
    cap = settings["train_cap"]  # None: every train caption (a number: a quick check of the script)
    extra = json.loads(args.fit_options)  # a variant's fine_tune options beyond the tree's defaults
    offset = extra.pop("seed_offset", 0)  # a variant trained from another seed: the noise of one training draw
    if args.part.startswith("set:"):
        from models.style_phrases import select_style_head

        c, styles = settings["sets"][args.part[4:]], settings["styles"][args.part[4:]]
        train = [(t, s) for s in styles for t in data["stylized"][(s, "train")][:cap]]
        train = [train[i] for i in np.random.default_rng(c["seed"]).permutation(len(train))]
        torch.manual_seed(c["seed"] + offset)
        clf = load_style_classifier(c["name_or_path"], styles, device="cpu", max_length=c["max_length"],
                                    with_factual=False)
        tick = time.perf_counter()
        fit = fine_tune(clf, [t for t, _ in train], [s for _, s in train], epochs=c["epochs"],
                        batch_size=c["batch_size"], lr=c["lr"], weight_decay=c["weight_decay"],
                        warmup_ratio=c["warmup_ratio"], seed=c["seed"] + offset, **extra)
        fit_s = time.perf_counter() - tick
        val = [(t, s) for s in styles for t in data["stylized"][(s, "val")]]
        metrics = clf.evaluate([t for t, _ in val], [s for _, s in val])
        e = settings["extract"]
        tick = time.perf_counter()
        selection = select_style_head(clf, [t for t, _ in train], [s for _, s in train], eps=e["eps"],
                                      batch_size=e["batch_size"], max_captions=e["head_selection_captions"],
                                      seed=c["seed"])
        head_s = time.perf_counter() - tick
        return {"fit_seconds": fit_s, "head_seconds": head_s, "steps": fit["steps"], "train_loss": fit["loss"],
                "train_captions": len(train), "val_accuracy": metrics["accuracy"],
                "val_accuracy_per_style": {s: metrics[f"accuracy/{s}"] for s in styles},
                "head": [selection.layer, selection.head],
                "eq2_confidence": selection.confidence.tolist(), "head_selection_captions": selection.n_captions}
    from models.caption_scoring import train_evaluation_classifiers

    v, styles = settings["evaluation"], settings["all_styles"]
    positives = {s: data["stylized"][(s, "train")][:cap] for s in styles}
    tick = time.perf_counter()
    classifiers = train_evaluation_classifiers("finetune", positives, data["factual"]["train"],
                                               name_or_path=v["name_or_path"], max_length=v["max_length"],
                                               device="cpu", epochs=v["epochs"], batch_size=v["batch_size"], lr=v["lr"],
                                               max_train_captions=v["max_train_captions"], seed=v["seed"] + offset,
                                               **extra)
    fit_s = time.perf_counter() - tick
    accuracy = {}
    for i, style in enumerate(styles):
        own = data["stylized"][(style, "val")]
        negatives = [x for part in test_negatives(data, len(own), v["seed"] + i).values() for x in part]
        accuracy[style] = classifiers.accuracy(style, own, negatives)["accuracy"]
    return {"fit_seconds": fit_s, "val_accuracy_per_style": accuracy,
            "train_captions": {s: 2 * len(t) for s, t in positives.items()}}


# -------------------------------------------------------------------------------------------------- parent side
def _settings(conf: str) -> dict:
    sys.path.insert(0, str(ROOT))
    from jobs.platform.config import load_config

    cfg = load_config(conf)
    common = ("name_or_path", "max_length", "epochs", "batch_size", "lr", "weight_decay", "warmup_ratio", "seed")
    sets = {name: {k: getattr(cfg.extract.classifier_for(name), k) for k in common} for name in cfg.style_sets}
    v = cfg.extract.evaluation
    return {"split_seed": 29, "sets": sets, "styles": {name: list(s) for name, s in cfg.style_sets.items()},
            "all_styles": list(cfg.styles),
            "extract": {"eps": cfg.extract.eps, "batch_size": cfg.extract.batch_size,
                        "head_selection_captions": cfg.extract.head_selection_captions},
            "evaluation": {k: getattr(v, k) for k in ("name_or_path", "max_length", "epochs", "batch_size", "lr",
                                                      "max_train_captions", "seed")},
            "new_defaults": {"classifier": {k: getattr(cfg.extract.classifier, k) for k in ("batch_order", "precision")},
                             "evaluation": {k: getattr(v, k) for k in ("batch_order", "precision")}}}


def _base_tree(base: str, into: Path) -> Path:
    """``models/`` of commit ``base``, extracted with ``git archive``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", base, "models"], check=True, capture_output=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def _run_child(tree: Path, part: str, settings: dict, fit_options: dict, args) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--tree", str(tree), "--part", part,
               "--settings", json.dumps(settings), "--fit-options", json.dumps(fit_options), "--data", args.data,
               "--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{part} on {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _compare_heads(old: dict, new: dict) -> dict:
    """Same head? Else the Eq. 2 score of each tree's head under its own classifier, and their relative gap."""
    old_score = old["eq2_confidence"][old["head"][0]][old["head"][1]]
    new_score = new["eq2_confidence"][new["head"][0]][new["head"][1]]
    return {"old": old["head"], "new": new["head"], "same": old["head"] == new["head"],
            "old_eq2": old_score, "new_eq2": new_score,
            "relative_gap": abs(new_score - old_score) / max(abs(old_score), 1e-12),
            "new_classifier_eq2_of_old_head": new["eq2_confidence"][old["head"][0]][old["head"][1]]}


def _summary(parts: dict, path: str) -> dict:
    """Variant ``path`` against old over the parts it ran: speedup, val accuracy deltas, heads, the bar (which
    needs every part)."""
    seconds = {p: sum(part[p]["fit_seconds"] + part[p].get("head_seconds", 0.0) for part in parts.values())
               for p in ("old", path)}
    deltas = {f"{name}/{style}": part[path]["val_accuracy_per_style"][style] - accuracy
              for name, part in parts.items() for style, accuracy in part["old"]["val_accuracy_per_style"].items()}
    heads = {name: _compare_heads(part["old"], part[path]) for name, part in parts.items() if "head" in part["old"]}
    out = {"parts": sorted(parts), "seconds_old": seconds["old"], "seconds": seconds[path], "speedup": seconds["old"] / seconds[path],
           "fit_speedup": sum(part["old"]["fit_seconds"] for part in parts.values())
           / sum(part[path]["fit_seconds"] for part in parts.values()),
           "val_accuracy_delta": deltas, "max_abs_val_accuracy_delta": max(abs(d) for d in deltas.values()),
           "heads": heads,
           "heads_same_or_within_1pct": all(h["same"] or h["relative_gap"] <= 0.01 for h in heads.values())}
    out["meets_bar"] = bool(len(parts) == len(PARTS) and out["speedup"] >= 1.5 and out["max_abs_val_accuracy_delta"] <= 0.01
                            and out["heads_same_or_within_1pct"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conf", default="conf/shared_data.yaml")
    parser.add_argument("--base", default=BASE, help="the commit whose models/ is the old path")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                        help="old: --base's models/; new: the working tree's defaults; new_bf16: and bf16 autocast")
    parser.add_argument("--data", default=os.environ.get("ERG_DATA", str(ROOT.parent / "shared" / "data")))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train-cap", type=int, default=None, help="train captions per style (a quick check)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "extract_speed.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--fit-options", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--add", action="store_true", help="run --variants other than old and add them to --out, "
                        "compared with the old path measured there (the same settings)")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args)))
        return 0
    if not (Path(args.data) / "senticap" / "senticap.json").exists():
        print(f"SKIP: the caption data is absent under {args.data}")
        return 0
    if not args.add and ("old" not in args.variants or len(args.variants) < 2):
        parser.error("--variants needs old and at least one new variant to compare with it")
    settings = {**_settings(args.conf), "train_cap": args.train_cap}
    command = "python benchmarks/extract_speed.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    out = Path(args.out)
    if args.add:
        result = json.loads(out.read_text())
        if result["settings"] != settings or result["base"] != args.base:
            parser.error(f"{out} was measured with other settings or another base: rerun it whole")
        result["commands"] = result.get("commands", []) + [command]
        args.variants = [v for v in args.variants if v != "old"]
        args.parts = [part for part in args.parts if part in result["parts"]]
    else:
        result = {"command": command, "base": args.base, "settings": settings, "threads": args.threads, "parts": {}}
    with tempfile.TemporaryDirectory() as tmp:
        base = _base_tree(args.base, Path(tmp))
        variants = {"old": (base, {}), "new": (ROOT, {}), "new_bf16": (ROOT, {"precision": "bf16"}),
                    "old_next_seed": (base, {"seed_offset": 1})}
        for i, part in enumerate(args.parts):
            order = args.variants[i % len(args.variants):] + args.variants[:i % len(args.variants)]
            runs = {}
            for path in order:
                tick = time.perf_counter()
                runs[path] = _run_child(variants[path][0], part, settings, variants[path][1], args)
                print(f"{part} {path}: fit {runs[path]['fit_seconds']:.0f} s"
                      + (f", heads {runs[path]['head_seconds']:.0f} s" if "head_seconds" in runs[path] else "")
                      + f", val {runs[path]['val_accuracy_per_style']} ({time.perf_counter() - tick:.0f} s wall)",
                      flush=True)
            entry = result["parts"].setdefault(part, {"order": []})
            entry["order"] += list(order)
            entry.update(runs)
    result["summary"] = {path: _summary({name: part for name, part in result["parts"].items() if path in part}, path)
                         for path in VARIANTS if path != "old" and any(path in p for p in result["parts"].values())}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
