"""GPU benchmark of the ``models/`` code without Spark: each model on the CPU and on ``--device``, in one run.

Writes ``benchmarks/results/gpu.json`` when ``--device`` is a GPU (``--out`` elsewhere, e.g. for a CPU check). Only the
repository travels to a GPU machine (no weights, no data, no Java, pyspark or faiss), so every model is built from a
config with random weights: throughput depends on the architecture, not on the weights. The tokenizers are trained
here on generated captions (:mod:`models.tokenizers_offline`) and padded with filler tokens to the vocabulary size of
the real model, so that embedding tables and softmax layers have their real sizes. Each part calls what a GPU
executor's UDF calls on a batch:

- ``embed``: MiniLM's architecture (all-MiniLM-L6-v2: 6 layers, 384 wide, 30,522 WordPiece tokens) through the
  embed UDF's own partition function (:func:`udfs.embedding.embed_partitions`, length bucketing included), fp32 on
  the CPU and fp32 and bf16 on the device (``embed.encoder.options.precision``). bf16 agreement: the top-1
  neighbour of each caption of one half among the other half, under bf16 vectors against fp32 ones, and their mean
  cosine.
- ``generate``: a GPT-2 small architecture (12 layers, 768 wide, 50,257 tokens) through the generator UDF's function
  (:func:`udfs.generation.make_generator`) with beam search. Random weights never emit the end token, so every
  caption decodes ``--max-new-tokens`` tokens (a trained generator stops earlier). bf16 agreement: the share of
  captions :func:`models.generator.generate` writes alike with the model in bf16 and in fp32 on the device.
- ``captioners``: NIC and the transformer captioner (the sizes of ``experiment.hparams`` in conf/shared_data.yaml)
  trained by :func:`models.captioner_training.train_worker`, the function TorchDistributor runs on each GPU, on
  textual-visual-context shaped features (8 regions x 384).
- ``classifier``: the style classifier on a BERT-base architecture (12 layers, 768 wide; ``extract.classifier`` on
  a cluster) fine-tuned by :func:`models.style_classifier.fine_tune`.

Rates are items (captions) or optimizer steps per second, timed after a warm-up; the first steps of a training run
are left out of its rate. ``--tiny`` shrinks every model and count (a check that the script runs, in seconds).

    python benchmarks/gpu_models.py --device cuda
    python benchmarks/gpu_models.py --device cpu --tiny --out /tmp/gpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

PARTS = ("embed", "generate", "captioners", "classifier")
STYLES = ("humor", "romantic")
SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "minilm": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536,
                   "vocab_size": 30522},
        "bert_base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                      "intermediate_size": 3072, "vocab_size": 30522},
        "gpt2": {"n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "vocab_size": 50257},
        "nic": {"embed_dim": 256, "hidden_dim": 512},
        "transformer": {"d_model": 256, "nhead": 4, "num_layers": 2},
        "regions": 8, "region_dim": 384,
    },
    "tiny": {
        "minilm": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                   "vocab_size": 600},
        "bert_base": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                      "vocab_size": 600},
        "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 128, "vocab_size": 600},
        "nic": {"embed_dim": 16, "hidden_dim": 32},
        "transformer": {"d_model": 32, "nhead": 2, "num_layers": 1},
        "regions": 2, "region_dim": 16,
    },
}
COUNTS: dict[str, dict[str, int]] = {
    "full": {"embed_items": 20000, "generate_items": 1024, "train_steps": 200, "classifier_steps": 100,
             "corpus": 3000},
    "tiny": {"embed_items": 96, "generate_items": 8, "train_steps": 6, "classifier_steps": 4, "corpus": 300},
}
SUBJECTS = ("a dog", "two men", "a young girl", "a woman", "a brown horse", "three children", "a surfer", "an old man",
            "a black cat", "a cyclist", "two women", "a boy", "a group of people", "a white bird", "a baby")
ACTIONS = ("runs across", "is sitting on", "plays in", "jumps over", "walks along", "stands near", "rides through",
           "looks at", "is sleeping on", "climbs", "waits beside", "is dancing in")
PLACES = ("the beach", "a grassy field", "the snow", "a busy street", "the river", "a wooden bench", "the park",
          "a red car", "the mountains", "a crowded market", "the kitchen", "the water")
PHRASES = ("looking for his lost bone", "in love with the sunshine", "to escape the boring homework",
           "dreaming of a sweet kiss", "like a crazy clown", "happy to be alive", "with a lot of love",
           "because the ice cream is gone", "ready for an adventure", "enjoying the beautiful day")


def captions(rng: random.Random, count: int) -> list[str]:
    """Factual-looking captions from templates, with a share of a style phrase, for tokenizers and inputs."""
    out = []
    for _ in range(count):
        text = f"{rng.choice(SUBJECTS)} {rng.choice(ACTIONS)} {rng.choice(PLACES)}"
        out.append(f"{text} {rng.choice(PHRASES)}" if rng.random() < 0.5 else text)
    return out


def pad_vocabulary(tokenizer, size: int) -> None:
    """Filler tokens up to ``size`` (the real model's vocabulary), so that its embedding and softmax are full size."""
    missing = size - len(tokenizer)
    if missing > 0:
        tokenizer.add_tokens([f"w{i:05d}x" for i in range(missing)])


def build_bert(folder: Path, sizes: dict[str, Any], corpus: list[str], seed: int) -> str:
    """A BERT-family model of ``sizes`` with random weights and a WordPiece tokenizer, saved for ``from_pretrained``."""
    import torch
    from transformers import BertConfig, BertModel

    from models.tokenizers_offline import train_bert_tokenizer

    tokenizer = train_bert_tokenizer(corpus, vocab_size=min(2000, sizes["vocab_size"]))
    pad_vocabulary(tokenizer, sizes["vocab_size"])
    torch.manual_seed(seed)
    config = BertConfig(**{**sizes, "vocab_size": len(tokenizer)}, max_position_embeddings=512,
                        pad_token_id=tokenizer.pad_token_id)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def build_gpt2(folder: Path, sizes: dict[str, Any], corpus: list[str], seed: int) -> str:
    """A GPT-2 generator of ``sizes`` with random weights (the product's causal generator layout), saved."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config

    from models.generator import StyleGenerator
    from models.tokenizers_offline import train_gpt2_tokenizer

    tokenizer = train_gpt2_tokenizer(corpus, vocab_size=min(2000, sizes["vocab_size"]))
    pad_vocabulary(tokenizer, sizes["vocab_size"])
    eos = tokenizer.eos_token_id
    torch.manual_seed(seed)
    config = GPT2Config(**{**sizes, "vocab_size": len(tokenizer)}, bos_token_id=eos, eos_token_id=eos,
                        pad_token_id=eos)
    model = AutoModelForCausalLM.from_config(config)
    return StyleGenerator("causal", model, tokenizer, torch.device("cpu")).save(folder)


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def step_rate(stamps: list[float], skip: int) -> float:
    """Steps per second over the step times after the first ``skip`` steps (warm-up left out)."""
    kept = stamps[skip:]
    if len(kept) < 2:
        raise SystemExit(f"too few steps to time ({len(stamps)}, {skip} skipped as warm-up): raise the step count")
    return (len(kept) - 1) / (kept[-1] - kept[0])


def param_count(module) -> int:
    return int(sum(p.numel() for p in module.parameters()))


# ---------------------------------------------------------------------------------------------------------- parts
def part_embed(args, work: Path, sizes: dict, rng: random.Random) -> dict:
    from udfs.embedding import EncoderSpec, embed_partitions

    path = build_bert(work / "minilm", sizes["minilm"], captions(rng, args.corpus), args.seed)
    texts = captions(rng, args.embed_items)
    frame = pd.DataFrame({"item_id": [f"{i:07d}" for i in range(len(texts))], "item_kind": "factual",
                          "modality": "text", "text": texts, "tags": None, "uri": None, "region_features": None})
    runs = [("cpu", "fp32"), (args.device, "fp32"), (args.device, "bf16")] if args.device != "cpu" else [
        ("cpu", "fp32"), ("cpu", "bf16")]
    vectors: dict[tuple[str, str], np.ndarray] = {}
    result: dict[str, Any] = {"model": "MiniLM architecture (all-MiniLM-L6-v2 sizes), random weights",
                              "config": sizes["minilm"], "batch_size": args.embed_batch, "runs": {}}
    for device, precision in runs:
        spec = EncoderSpec.of("sentence", path, device, args.embed_batch,
                              {} if precision == "fp32" else {"precision": precision})
        run = embed_partitions(spec)
        list(run(iter([frame.iloc[:args.embed_batch]])))  # warm-up: load, first kernels
        count = len(frame) if device != "cpu" or args.device == "cpu" else max(args.embed_batch,
                                                                               int(len(frame) * args.cpu_share))
        batches = [frame.iloc[i:i + 256] for i in range(0, count, 256)]  # as Arrow hands the UDF its batches
        synchronize(device)
        started = time.perf_counter()
        out = pd.concat(list(run(iter(batches))), ignore_index=True)
        synchronize(device)
        seconds = time.perf_counter() - started
        if out["skip_reason"].notna().any():
            raise SystemExit(f"embed on {device} {precision}: {out['skip_reason'].dropna().iloc[0]}")
        vectors[(device, precision)] = np.stack(out["vector"].to_numpy()).astype(np.float32)
        result["runs"][f"{device}/{precision}"] = {"device": device, "precision": precision, "items": count,
                                                   "seconds": seconds, "items_per_s": count / seconds}
        print(f"embed {device} {precision}: {count / seconds:.1f} captions/s", file=sys.stderr)
    fp32, bf16 = vectors[(args.device, "fp32")], vectors[(args.device, "bf16")]
    half = len(fp32) // 2
    top1 = ((fp32[:half] @ fp32[half:].T).argmax(1) == (bf16[:half] @ bf16[half:].T).argmax(1)).mean()
    result["bf16_top1_agreement"] = float(top1)
    result["bf16_mean_cosine_to_fp32"] = float((fp32 * bf16).sum(1).mean())
    result["bf16_agreement_items"] = f"{half} captions, each against the other {len(fp32) - half}"
    cpu = result["runs"]["cpu/fp32"]["items_per_s"]
    result["speedup_vs_cpu"] = {k: v["items_per_s"] / cpu for k, v in result["runs"].items()}
    return result


def part_generate(args, work: Path, sizes: dict, rng: random.Random) -> dict:
    from models.generator import generate, load_generator
    from udfs.generation import make_generator

    path = build_gpt2(work / "gpt2", sizes["gpt2"], captions(rng, args.corpus), args.seed)
    factual = captions(rng, args.generate_items)
    frame = pd.DataFrame({"query_id": [f"q{i}" for i in range(len(factual))], "factual_caption": factual,
                          "style_phrase": [rng.choice(PHRASES) for _ in factual],
                          "style": [rng.choice(STYLES) for _ in factual]})
    decoding = {"strategy": "beam", "num_beams": args.num_beams, "max_new_tokens": args.max_new_tokens,
                "batch_size": args.generate_batch, "constraint": "none", "seed": args.seed,
                "no_repeat_ngram_size": 0, "repetition_penalty": 1.0, "fast": False}  # plain beam search
    lengths = {"max_source_len": 64, "max_target_len": 48}
    result: dict[str, Any] = {"model": "GPT-2 small architecture, random weights", "config": sizes["gpt2"],
                              "decoding": decoding, "runs": {},
                              "note": "random weights never emit the end token: every caption decodes max_new_tokens"}
    written: dict[str, list[str]] = {}
    devices = ["cpu"] + ([args.device] if args.device != "cpu" else [])
    for device in devices:
        run = make_generator(path, "causal", decoding, device, **lengths)
        list(run(iter([frame.iloc[:args.generate_batch]])))  # warm-up
        count = len(frame) if device != "cpu" or args.device == "cpu" else max(
            args.generate_batch, int(len(frame) * args.cpu_share))
        synchronize(device)
        started = time.perf_counter()
        out = pd.concat(list(run(iter([frame.iloc[:count]]))), ignore_index=True)
        synchronize(device)
        seconds = time.perf_counter() - started
        written[device] = out["generated_caption"].tolist()
        result["runs"][f"{device}/fp32"] = {"device": device, "precision": "fp32", "items": count,
                                            "seconds": seconds, "items_per_s": count / seconds}
        print(f"generate {device} fp32: {count / seconds:.2f} captions/s", file=sys.stderr)
    import torch

    gen = load_generator("causal", path, device=args.device, **lengths)
    gen.model.to(torch.bfloat16)
    count = result["runs"][f"{args.device}/fp32"]["items"]
    synchronize(args.device)
    started = time.perf_counter()
    bf16 = generate(gen, frame["style_phrase"].tolist()[:count], frame["factual_caption"].tolist()[:count],
                    **decoding)
    synchronize(args.device)
    seconds = time.perf_counter() - started
    result["runs"][f"{args.device}/bf16"] = {"device": args.device, "precision": "bf16", "items": count,
                                             "seconds": seconds, "items_per_s": count / seconds,
                                             "called": "models.generator.generate, the model cast to bf16"}
    same = [a == b for a, b in zip(written[args.device], bf16)]
    result["bf16_same_text_share"] = float(np.mean(same))
    result["bf16_agreement_items"] = count
    result["parameters"] = param_count(gen.model)
    cpu = result["runs"]["cpu/fp32"]["items_per_s"]
    result["speedup_vs_cpu"] = {k: v["items_per_s"] / cpu for k, v in result["runs"].items()}
    return result


def part_captioners(args, work: Path, sizes: dict, rng: random.Random) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from models.captioner_training import train_worker

    regions, dim = sizes["regions"], sizes["region_dim"]
    rows = args.train_steps * args.train_batch
    array = np.random.default_rng(args.seed).standard_normal((rows, regions * dim)).astype(np.float32)
    table = pa.table({"features": pa.array(list(array), type=pa.list_(pa.float32())),
                      "style": [rng.choice(STYLES) for _ in range(rows)], "caption": captions(rng, rows)})
    data = work / "captions.parquet"
    pq.write_table(table, data)
    result: dict[str, Any] = {"features": f"{regions} regions x {dim} (textual visual context)", "rows": rows,
                              "batch_size": args.train_batch, "warmup_steps_left_out": args.warmup_steps,
                              "called": "models.captioner_training.train_worker (one process, 1 epoch)"}
    for kind in ("nic", "transformer"):
        entry: dict[str, Any] = {"hparams": sizes[kind], "runs": {}}
        for device in ["cpu"] + ([args.device] if args.device != "cpu" else []):
            stamps: list[float] = []

            def on_step(step: int, metrics: dict, stamps=stamps, device=device) -> None:
                synchronize(device)
                stamps.append(time.perf_counter())

            summary = train_worker({"train_paths": [str(data)], "output_dir": str(work / f"{kind}-{device}"),
                                    "kind": kind, "hparams": sizes[kind], "feature_regions": regions, "epochs": 1,
                                    "batch_size": args.train_batch, "device": device, "log_every": 1,
                                    "seed": args.seed}, on_step=on_step)
            rate = step_rate(stamps, args.warmup_steps)
            entry["runs"][device] = {"device": device, "steps": summary["steps"], "steps_per_s": rate,
                                     "items_per_s": rate * args.train_batch, "loss_first": summary["loss_first"],
                                     "loss_last": summary["loss_last"]}
            print(f"{kind} {device}: {rate:.2f} steps/s", file=sys.stderr)
        cpu = entry["runs"]["cpu"]["steps_per_s"]
        entry["speedup_vs_cpu"] = {k: v["steps_per_s"] / cpu for k, v in entry["runs"].items()}
        result[kind] = entry
    return result


def part_classifier(args, work: Path, sizes: dict, rng: random.Random) -> dict:
    from models.style_classifier import fine_tune, load_style_classifier

    path = build_bert(work / "bert_base", sizes["bert_base"], captions(rng, args.corpus), args.seed)
    labels = ["factual", *STYLES]
    rows = args.classifier_steps * args.classifier_batch
    texts = captions(rng, rows)
    targets = [rng.choice(labels) for _ in texts]
    result: dict[str, Any] = {"model": "BERT-base architecture, random weights, new style head",
                              "config": sizes["bert_base"], "batch_size": args.classifier_batch,
                              "warmup_steps_left_out": args.warmup_steps, "runs": {},
                              "called": "models.style_classifier.fine_tune (1 epoch)"}
    for device in ["cpu"] + ([args.device] if args.device != "cpu" else []):
        clf = load_style_classifier(path, labels=labels, device=device)
        stamps: list[float] = []

        def on_step(step: int, metrics: dict, stamps=stamps, device=device) -> None:
            synchronize(device)
            stamps.append(time.perf_counter())

        summary = fine_tune(clf, texts, targets, epochs=1, batch_size=args.classifier_batch, on_step=on_step)
        rate = step_rate(stamps, args.warmup_steps)
        result["runs"][device] = {"device": device, "steps": summary["steps"], "steps_per_s": rate,
                                  "items_per_s": rate * args.classifier_batch, "loss": summary["loss"]}
        result["parameters"] = param_count(clf.model)
        print(f"classifier {device}: {rate:.2f} steps/s", file=sys.stderr)
    cpu = result["runs"]["cpu"]["steps_per_s"]
    result["speedup_vs_cpu"] = {k: v["steps_per_s"] / cpu for k, v in result["runs"].items()}
    return result


PART_FUNCTIONS: dict[str, Callable[..., dict]] = {"embed": part_embed, "generate": part_generate,
                                                  "captioners": part_captioners, "classifier": part_classifier}


# ----------------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="the device measured against the CPU: cuda, cuda:1, cpu")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {PARTS}")
    parser.add_argument("--tiny", action="store_true", help="tiny models and counts: a check that it runs")
    parser.add_argument("--out", type=Path, default=None,
                        help="the JSON to write (default benchmarks/results/gpu.json on a GPU; none on the CPU)")
    parser.add_argument("--cpu-share", type=float, default=0.125,
                        help="share of the items the CPU runs embed and generate (its rate is per item)")
    parser.add_argument("--embed-items", type=int, default=None)
    parser.add_argument("--embed-batch", type=int, default=64)
    parser.add_argument("--generate-items", type=int, default=None)
    parser.add_argument("--generate-batch", type=int, default=32)
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=20)
    parser.add_argument("--train-steps", type=int, default=None, help="captioner optimizer steps per device")
    parser.add_argument("--train-batch", type=int, default=32)
    parser.add_argument("--classifier-steps", type=int, default=None, help="classifier optimizer steps per device")
    parser.add_argument("--classifier-batch", type=int, default=32)
    parser.add_argument("--warmup-steps", type=int, default=None, help="first steps left out of a training rate")
    parser.add_argument("--corpus", type=int, default=None, help="generated captions the tokenizers are trained on")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}: choose from {PARTS}")
    scale = "tiny" if args.tiny else "full"
    for name, value in COUNTS[scale].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.warmup_steps is None:
        args.warmup_steps = 1 if args.tiny else 5

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: torch {torch.__version__} sees no CUDA device")
    out = args.out or (REPO / "benchmarks" / "results" / "gpu.json" if args.device != "cpu" else None)
    result: dict[str, Any] = {
        "command": "python benchmarks/gpu_models.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "device": args.device, "scale": scale,
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else None},
        "weights": "random (built from configs): rates depend on the architecture, not on the weights",
    }
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="erg-gpu-models-") as folder:
        for part in parts:
            result[part] = PART_FUNCTIONS[part](args, Path(folder), SIZES[scale], rng)
            if out is not None:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(result, indent=2))
    if out is None:
        print(json.dumps(result, indent=2))
    else:
        print(f"wrote {out}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
