"""Benchmark of ``erg run`` end to end: cost vs factual corpus size, and the cost of a no-op incremental rerun.

For each factual corpus size (default 1K, 10K, 100K captions) the generated sample is written into a fresh schema
(its tables, models, watermarks and sample folder under the benchmark home are removed first), then:

1. the full pipeline ``jobs.run(spark, cfg)`` (ingest -> extract -> embed -> retrieve -> generate) is timed by
   the wall clock around it and by the ``stage_seconds.<stage>`` metrics it logs on its parent MLflow run;
2. ``jobs.run(spark, cfg, incremental=True)`` is run again with nothing new and timed the same way.

Only the factual corpus grows: the number of images (``--images``) and ``sample.stylized_per_style`` stay fixed, so
with the sample's fixed seed the stylized captions, the images and their scenes are the same bytes at every size;
factual captions per image = size / images. Generation is bounded by ``generate.max_candidates`` (the conf's value
or ``--max-candidates``): each run turns at most that many retrieval hits into generated captions, so the
generate stage does not grow with the corpus. Because the cap is per run, an incremental rerun picks up the hits
the first run left over; the new candidates it generated are printed next to the rerun ratios.

Printed, with no assertion on time (the machine may be shared): seconds of each stage as ratios to the smallest
size (the smallest size's seconds as the base), the rerun as a ratio to the full run of the same size, and embed
throughput (items encoded per second of the embed stage). Everything, absolute seconds included, goes to ``--out``.
The first run in a fresh process pays one-off start-up costs; ``--warmup`` runs the smallest size once, unmeasured,
before the measured runs, so that they do not inflate the base of the ratios.

    python benchmarks/e2e_cost.py --warmup                           # 1K, 10K, 100K on conf/local.yaml
    python benchmarks/e2e_cost.py --conf test --sizes 200,1000       # a quick check
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import jobs  # noqa: E402
from jobs.pipeline import STAGES  # noqa: E402
from jobs.platform.config import ErgConfig, load_config  # noqa: E402
from jobs.sample import write_sample  # noqa: E402

TOTAL = "total (wall)"


def parse_sizes(text: str) -> list[int]:
    """``"1000,10000"`` -> ``[1000, 10000]`` (sorted, distinct, positive): sizes, or any list of counts."""
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, e.g. 1000,10000; got {text!r}")
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"expected at least one positive integer; got {text!r}")
    return sizes


def size_config(conf: str, size: int, images: int, max_candidates: int | None, master: str | None,
                schema: str | None = None) -> ErgConfig:
    """The conf for one corpus size: its own schema (default ``e2e_<size>``) and sample folder, ``size`` factual
    captions over ``images``."""
    schema = schema or f"e2e_{size}"
    overrides = [f"tables.schema={schema}", f"sample.n_images={images}", f"sample.factual_captions={size}",
                 "spark.show_progress=false", f"sample.dir={os.environ['ERG_HOME']}/samples/{schema}"]
    if max_candidates is not None:
        overrides.append(f"generate.max_candidates={max_candidates}")
    if master:
        overrides.append(f"spark.master={master}")
    cfg = load_config(conf, overrides)
    if size % images:
        raise ValueError(f"size {size} is not a multiple of --images {images}: the sample writes "
                         f"size // images factual captions per image; choose sizes that are multiples of {images}")
    if cfg.sample.stylized_per_style > images // 2:
        raise ValueError(f"sample.stylized_per_style={cfg.sample.stylized_per_style} needs at least "
                         f"{2 * cfg.sample.stylized_per_style} images, --images is {images}: raise --images")
    if cfg.generate.max_candidates is None:
        raise ValueError(f"conf {conf!r} sets no generate.max_candidates: pass --max-candidates so that "
                         "generation stays bounded as the corpus grows")
    return cfg


def fresh_schema(cfg: ErgConfig) -> None:
    """Remove this schema's Delta tables, models, watermarks and sample from the benchmark home (never elsewhere)."""
    home = Path(cfg.home).resolve()
    schema = cfg.tables.schema_name
    paths = [Path(cfg.tables.location or home / "warehouse") / schema, home / "models" / schema,
             home / "state" / f"watermarks.local.{schema}.json", Path(cfg.sample.dir)]
    for path in paths:
        path = path.resolve()
        if home not in path.parents:
            raise ValueError(f"refusing to remove {path}: it is outside the benchmark home {home}")
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def timed_run(spark, cfg: ErgConfig, incremental: bool) -> dict[str, Any]:
    """One ``jobs.run`` (``erg run``): wall seconds, the stage seconds from its parent MLflow run, and each stage's
    counts."""
    import mlflow

    started = time.perf_counter()
    results = jobs.run(spark, cfg, incremental=incremental)
    wall = time.perf_counter() - started
    metrics = mlflow.get_run(results["parent_run_id"]).data.metrics
    stage_s = {stage: metrics[f"stage_seconds.{stage}"] for stage in STAGES}
    embedded = results["embed"].get("encoded", 0)
    return {"wall_s": wall, "stage_s": stage_s, "parent_run_id": results["parent_run_id"],
            "embed_items_encoded": embedded,
            "embed_rows_per_s": embedded / stage_s["embed"] if stage_s["embed"] > 0 else None,
            "generate_candidates": results["generate"].get("candidates"),
            "retrieve_skipped": "skipped" in results["retrieve"],
            "results": {stage: results[stage] for stage in STAGES}}


def seconds(run: dict[str, Any]) -> dict[str, float]:
    """Per-stage seconds plus the wall total of one timed run."""
    return {**run["stage_s"], TOTAL: run["wall_s"]}


def ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def report(measured: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Print the ratio tables; returns them for the JSON."""
    sizes = sorted(measured)
    base = seconds(measured[sizes[0]]["full"])
    rows = list(STAGES) + [TOTAL]
    width = max(len(r) for r in rows) + 2
    vs_smallest = {str(s): {r: ratio(seconds(measured[s]["full"])[r], base[r]) for r in rows} for s in sizes}
    rerun_vs_full = {str(s): {r: ratio(seconds(measured[s]["rerun"])[r], seconds(measured[s]["full"])[r])
                              for r in rows} for s in sizes}

    print(f"\n== full run: seconds per stage as a ratio to {sizes[0]:,} factual captions "
          f"(base = seconds at {sizes[0]:,})")
    print(f"{'stage':<{width}}{'base s':>10}" + "".join(f"{f'x @ {s:,}':>14}" for s in sizes))
    for r in rows:
        print(f"{r:<{width}}{base[r]:>10.1f}" + "".join(f"{fmt(vs_smallest[str(s)][r]):>14}" for s in sizes))

    print("\n== incremental rerun with nothing new: seconds as a ratio to the full run of the same size")
    print(f"{'stage':<{width}}" + "".join(f"{f'@ {s:,}':>14}" for s in sizes))
    for r in rows:
        print(f"{r:<{width}}" + "".join(f"{fmt(rerun_vs_full[str(s)][r]):>14}" for s in sizes))
    print(f"{'  new candidates':<{width}}"
          + "".join(f"{measured[s]['rerun']['generate_candidates']:>14}" for s in sizes))
    print(f"{'  retrieve skipped':<{width}}"
          + "".join(f"{str(measured[s]['rerun']['retrieve_skipped']).lower():>14}" for s in sizes))

    print("\n== embed throughput (items encoded / embed stage seconds, full run)")
    print(f"{'':<{width}}" + "".join(f"{f'@ {s:,}':>14}" for s in sizes))
    print(f"{'items encoded':<{width}}" + "".join(f"{measured[s]['full']['embed_items_encoded']:>14,}" for s in sizes))
    print(f"{'rows/s':<{width}}" + "".join(f"{fmt(measured[s]['full']['embed_rows_per_s'], '.1f'):>14}"
                                           for s in sizes))
    return {"full_vs_smallest": vs_smallest, "rerun_vs_full": rerun_vs_full}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=parse_sizes, default=[1000, 10000, 100000],
                        help="factual corpus sizes, comma-separated (multiples of --images)")
    parser.add_argument("--conf", choices=["local", "test"], default="local")
    parser.add_argument("--images", type=int, default=200, help="images of the sample, fixed across sizes")
    parser.add_argument("--max-candidates", type=int, default=None,
                        help="generate.max_candidates (default: the conf's) that bounds generation per run")
    parser.add_argument("--master", default=None, help="spark.master (default: the conf's)")
    parser.add_argument("--warmup", action="store_true",
                        help="first run the pipeline once, unmeasured, at the smallest size in schema e2e_warmup, so "
                             "that one-off start-up costs (Python workers, Delta, model loading) do not inflate the "
                             "smallest size, the base of the ratios")
    parser.add_argument("--home", type=Path, default=REPO / ".erg" / "benchmarks" / "e2e",
                        help="ERG_HOME of the benchmark: tables, models, MLflow store, samples")
    parser.add_argument("--out", type=Path, default=None, help="JSON results (default: <home>/e2e_cost.json)")
    args = parser.parse_args()
    if args.images < 8:
        parser.error("--images must be at least 8 (sample.n_images)")

    args.home.mkdir(parents=True, exist_ok=True)
    os.environ["ERG_HOME"] = str(args.home.resolve())
    out = args.out or args.home / "e2e_cost.json"
    configs = {size: size_config(args.conf, size, args.images, args.max_candidates, args.master)
               for size in args.sizes}
    warmup = size_config(args.conf, args.sizes[0], args.images, args.max_candidates, args.master,
                         schema="e2e_warmup") if args.warmup else None

    from jobs.platform.spark import get_spark

    for cfg in [*configs.values(), *([warmup] if warmup else [])]:  # before the session creates any tables
        fresh_schema(cfg)
    spark = get_spark(configs[args.sizes[0]])
    if warmup:
        write_sample(warmup)
        get_spark(warmup)
        print(f"\n## warm-up: {args.sizes[0]:,} factual captions in schema e2e_warmup, not measured", file=sys.stderr)
        jobs.run(spark, warmup)
    measured: dict[int, dict[str, Any]] = {}
    for size, cfg in configs.items():
        sample = write_sample(cfg)
        print(f"\n## {size:,} factual captions: schema {cfg.tables.schema_name}, sample {sample}", file=sys.stderr)
        get_spark(cfg)
        full = timed_run(spark, cfg, incremental=False)
        rerun = timed_run(spark, cfg, incremental=True)
        measured[size] = {"schema": cfg.tables.schema_name, "sample": sample, "full": full, "rerun": rerun}
    spark.stop()

    first = configs[args.sizes[0]]
    print(f"\nconf {args.conf}, spark {first.spark.master}, {args.images} images, "
          f"stylized set fixed ({measured[args.sizes[0]]['sample']['stylized']} captions incl. planted bad rows), "
          f"factual = {', '.join(f'{s:,}' for s in args.sizes)} captions")
    print(f"warm-up run before measuring: {'yes' if warmup else 'no (the smallest size pays start-up costs)'}")
    print(f"generation bounded: generate.max_candidates = {first.generate.max_candidates} new candidates per run")
    ratios = report(measured)
    payload = {"conf": args.conf, "master": first.spark.master, "images": args.images, "warmup": args.warmup,
               "stylized_per_style": first.sample.stylized_per_style,
               "max_candidates": first.generate.max_candidates, "sizes": args.sizes,
               "ratios": ratios, "runs": {str(s): m for s, m in measured.items()}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, default=str))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
