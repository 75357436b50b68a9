"""Scale benchmark: how close the model UDFs run to this CPU's limit, and how the jobs grow to 1M factual captions.

Writes ``benchmarks/results/scale.json``. Every part measures its ratios within one run, and the part's command is
stored beside its result. Parts can be run separately (``--parts``); each run updates only the parts it ran. What
each part does:

- ``kernels``: fp32 matmul peak of this machine: the best ``torch.mm`` rate of n x n products, n = 1024, 2048 and
  4096, on the process's torch threads.
- ``embed``: N real factual captions (COCO Karpathy references of ../shared/data; the sample's captions without it)
  embedded by a plain loop and by the embed UDF on the standalone cluster.
  - The plain loop is Hugging Face MiniLM over batches of 64 in input order, mean pooled, with all torch threads.
  - The UDF is ``udfs.embedding.embed_partitions`` in ``mapInPandas``: one torch thread per worker core, with
    length bucketing. It reads the captions from parquet files and writes the vectors to parquet, as the embed job
    reads and writes Delta; the clock covers that read, the UDF and the write.
  - ``udf_gflops``: the real-token FLOPs (no padding: 2 x the MACs of the projections, the FFN and attention over each
    caption's own tokens) divided by the UDF's seconds.
  - Each reduced precision of the encoder (``embed.encoder.options.precision``: int8, bf16) goes through the same
    UDF. Its quality is the top-1 retrieval agreement with fp32: factual queries against the FlickrStyle stylized
    scenes, both sides embedded at that precision.
- ``retrieval``: Q queries x S scenes of clustered random unit vectors (``--dim`` wide; the vector source is named
  in the result).
  - Exact search is a Faiss flat inner-product index. The approximate indexes are IVF and HNSW built with the base
    conf's ``retrieve.index`` settings; each is searched through ``SceneIndex.search``, as the UDF does, at conf's
    nprobe / ef_search and at the ``--ivf-nprobes`` / ``--hnsw-ef-searches`` values (the same built index).
  - Reported per setting: recall@10 against exact, and seconds (build + search). ``approx`` is the fastest setting
    with recall@10 >= 0.95.
- ``retrieval_real``: approximate search on real text vectors at ``--real-scenes`` (100K) x ``--real-queries``
  (1M). The vectors are the MiniLM vectors of an ERG home's ``embeddings`` table (``--home``, written by
  ``erg embed``; read with delta-rs, else Spark).
  - Scenes: the stylized captions and the scene descriptions (the Flickr30K captions of the FlickrStyle train
    images that ``retrieve.train_descriptions_as_queries`` embeds), topped up with jittered copies
    (``--scene-jitter``). Queries: the factual captions of P, each copied in turn with a Gaussian jitter of
    ``--jitter`` per component and renormalised; the mean cosine of the copies to their source is reported.
  - Exact search (Faiss flat inner product, all threads) of every query is timed (or ``--exact-queries`` of them,
    scaled linearly: the result says so). ``auto`` (``retrieve.index.type``, the product's own
    ``models.scene_index.tune_scene_index`` with the conf's settings) picks an index on a sample of the queries;
    that index then searches every query, timed, and its recall@10 against exact is measured on
    ``--recall-queries`` held queries the tuning never saw. ``speedup_vs_exact`` is search against search;
    ``speedup_vs_exact_with_build`` adds each index's build.
  - ``sweep``: every rung of the HNSW, HNSW-SQ8 ef_search and IVF nprobe ladders, recall on the held queries and time on a
    fixed subset (``--sweep-time-queries``); ``fastest_meeting_target`` is the fastest with recall@10 >= 0.95.
- ``sizes``: the scale corpus of the sample's generator, 10K / 100K / 1M factual captions over a fixed set of
  images and stylized captions. Ingest, embed and retrieve run as jobs on a standalone cluster (1 master + 2 workers
  x 1 core).
  - At the largest size (``--copy-vectors-at``), the factual vectors are not computed by the UDF. They are copied
    from the previous size's embeddings of the same caption text (the scale corpus repeats its captions). This is
    a Spark join written by ``merge_rows``, timed as that size's embed step and named in the result.
    ``--copy-vectors-at ''`` embeds every size with the UDF.
  - A size measured again replaces its entry; the others keep theirs, each with the command that measured it.
- ``incremental``: on the ``--incremental-size`` schema (100K by default), one run with 1% new stylized and factual
  rows (ingest, embed, retrieve ``incremental=True``), against the full run of that size, which must have embedded
  its vectors with the UDF.
- ``generate``: the generator UDF (``udfs.generation.make_generator`` in ``mapInPandas``) against a plain
  ``models.generator.generate`` loop over the same candidates. It uses the current generator and the retrieval
  candidates of an existing ERG home (``--generate-home``, e.g. the real-data run).

    python benchmarks/scale.py --parts kernels,embed,retrieval,sizes,incremental,generate
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

PARTS = ("kernels", "embed", "retrieval", "retrieval_real", "sizes", "incremental", "generate")
DATA = Path(os.environ.get("ERG_DATA", REPO.parent / "shared" / "data"))


# ------------------------------------------------------------------------------------------------------ kernels
def matmul_gflops(sizes: tuple[int, ...] = (1024, 2048, 4096), repeats: int = 5) -> float:
    """Best fp32 ``torch.mm`` rate over ``repeats`` runs of n x n products for each n of ``sizes``, in GFLOP/s."""
    import torch

    best_rate = 0.0
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - started)
        best_rate = max(best_rate, 2 * n**3 / best / 1e9)
    return best_rate


# -------------------------------------------------------------------------------------------------------- embed
def real_captions(limit: int) -> tuple[list[str], list[str], str]:
    """(factual queries, stylized scenes, where they came from): COCO Karpathy references and FlickrStyle10K's
    humor + romantic captions of ../shared/data, else the generated sample's captions."""
    coco = DATA / "coco_karpathy_test"
    flickr = DATA / "flickrstyle10k"
    if coco.is_dir() and flickr.is_dir():
        queries = []
        for k in range(1, 6):
            queries += [line.strip() for line in (coco / f"karpathy-refs-{k}.txt").read_text(
                encoding="utf-8", errors="replace").splitlines() if line.strip()]
        queries = queries[:limit]
        scenes = []
        for name, encoding in (("funny_train.txt", "utf-8"), ("romantic_train.txt", "latin-1")):
            lines = (flickr / name).read_bytes().decode(encoding, errors="replace").splitlines()
            scenes += [line.strip() for line in lines if line.strip()]
        return queries, scenes, f"{coco} (queries), {flickr} humor + romantic (scenes)"
    from jobs.sample import HUMOR_PHRASES, ROMANTIC_PHRASES, factual_caption, sample_scene
    import random

    rng = random.Random(0)
    scenes_ = [sample_scene(i, rng) for i in range(600)]
    queries = [factual_caption(rng, s["subject"], s["action"], s["place"], s["color"]) for s in scenes_ for _ in range(
        max(1, limit // 600))][:limit]
    scenes = [f"{factual_caption(rng, s['subject'], s['action'], s['place'], s['color'])} "
              f"{rng.choice(HUMOR_PHRASES + ROMANTIC_PHRASES)}" for s in scenes_]
    return queries, scenes, "the generated sample's templates (../shared/data is absent)"


def real_token_flops(model_config: Any, token_counts: np.ndarray) -> float:
    """FLOPs of a BERT encoder over captions of ``token_counts`` real tokens each: per layer and token, the Q/K/V/O
    projections (4 d^2 MACs) and the FFN (2 d ff MACs); per layer and caption, attention scores and their weighted
    sum (2 n^2 d MACs). 2 FLOPs per MAC; embeddings, layer norms and softmax left out."""
    d, ff, layers = model_config.hidden_size, model_config.intermediate_size, model_config.num_hidden_layers
    n = token_counts.astype(np.float64)
    macs = layers * ((4 * d * d + 2 * d * ff) * n.sum() + 2 * d * (n**2).sum())
    return 2 * macs


def plain_loop(texts: list[str], batch_size: int = 64) -> tuple[np.ndarray, float]:
    """Plain torch MiniLM: batches of ``batch_size`` in input order, mean pooling, L2; (vectors, seconds)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from models.encoders import resolve_model_path

    path = resolve_model_path("all-MiniLM-L6-v2")
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    out = []
    started = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(texts[start:start + batch_size], padding=True, truncation=True, max_length=256,
                              return_tensors="pt")
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
    return np.concatenate(out), time.perf_counter() - started


def udf_embed(spark, texts: list[str], precision: str, partitions: int, work: Path) -> tuple[np.ndarray, float]:
    """The embed UDF over ``texts`` (as factual items) on the session's executors, as the embed job runs it: read
    from ``partitions`` parquet files, vectors written to parquet. Returns (vectors in input order, seconds of the
    read-embed-write). The input files are written and the executors load the encoder before the clock starts."""
    from udfs.embedding import EMBEDDED_SCHEMA, INPUT_COLUMNS, EncoderSpec, embed_partitions

    spec = EncoderSpec.of("sentence", "all-MiniLM-L6-v2", "cpu", 64,
                          {} if precision == "fp32" else {"precision": precision})
    frame = pd.DataFrame({"item_id": [f"{i:09d}" for i in range(len(texts))], "item_kind": "factual",
                          "modality": "text", "text": texts, "tags": None, "uri": None, "region_features": None})
    schema = ("item_id string, item_kind string, modality string, text string, tags string, uri string, "
              "region_features binary")
    source = work / "udf_input"
    spark.createDataFrame(frame[list(INPUT_COLUMNS)], schema).repartition(partitions).write.mode(
        "overwrite").parquet(str(source))

    def run(rows, name: str) -> float:
        started = time.perf_counter()
        rows.mapInPandas(embed_partitions(spec), EMBEDDED_SCHEMA).select("item_id", "vector").write.mode(
            "overwrite").parquet(str(work / name))
        return time.perf_counter() - started

    # warm-up: each worker loads the encoder once (cached for later tasks of the same spec)
    run(spark.read.parquet(str(source)).limit(partitions * 64).repartition(partitions), "udf_warmup")
    seconds = run(spark.read.parquet(str(source)), f"udf_output_{precision}")
    got = pd.read_parquet(work / f"udf_output_{precision}").sort_values("item_id")
    return np.stack(got["vector"].to_numpy()).astype(np.float32), seconds


def top1_agreement(queries_a, scenes_a, queries_b, scenes_b) -> float:
    return float(((queries_a @ scenes_a.T).argmax(1) == (queries_b @ scenes_b.T).argmax(1)).mean())


def part_embed(spark, args) -> dict:
    from transformers import AutoConfig, AutoTokenizer

    from models.encoders import load_encoder, resolve_model_path

    queries, scenes, source = real_captions(args.embed_items)
    path = resolve_model_path("all-MiniLM-L6-v2")
    tokens = np.array([len(ids) for ids in AutoTokenizer.from_pretrained(path)(
        queries, truncation=True, max_length=256).input_ids])
    flops = real_token_flops(AutoConfig.from_pretrained(path), tokens)
    plain_vectors, plain_s = plain_loop(queries)
    print(f"plain loop: {len(queries) / plain_s:.1f} captions/s", file=sys.stderr)
    result: dict[str, Any] = {"items": len(queries), "source": source, "mean_tokens": float(tokens.mean()),
                              "real_token_gflop": flops / 1e9, "plain_items_per_s": len(queries) / plain_s,
                              "plain_gflops": flops / plain_s / 1e9, "partitions": args.partitions}
    # quality and encoder speed of each precision: a query and a scene subset through SceneEncoder.encode_texts
    rng = np.random.default_rng(0)
    q_sub = [queries[i] for i in rng.choice(len(queries), min(args.agreement_queries, len(queries)), replace=False)]
    s_sub = [scenes[i] for i in rng.choice(len(scenes), min(args.agreement_scenes, len(scenes)), replace=False)]
    encoded: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    precisions: dict[str, dict[str, Any]] = {}
    for precision in ["fp32", *args.precisions]:
        encoder = load_encoder("sentence", device="cpu", precision=precision)
        encoder.encode_texts(q_sub[:64], 64)  # warm-up
        started = time.perf_counter()
        encoded[precision] = (encoder.encode_texts(q_sub, 64), encoder.encode_texts(s_sub, 64))
        entry = {"encoder_items_per_s": (len(q_sub) + len(s_sub)) / (time.perf_counter() - started)}
        if precision != "fp32":
            entry["top1_agreement"] = top1_agreement(*encoded["fp32"], *encoded[precision])
            entry["mean_cosine_to_fp32"] = float((encoded[precision][0] * encoded["fp32"][0]).sum(1).mean())
            entry["encoder_speedup_vs_fp32"] = entry["encoder_items_per_s"] / precisions["fp32"]["encoder_items_per_s"]
        precisions[precision] = entry
        print(f"{precision}: encoder {entry['encoder_items_per_s']:.1f} captions/s"
              + (f", top-1 agreement {entry['top1_agreement']:.4f}" if "top1_agreement" in entry else ""),
              file=sys.stderr)
    # the UDF at fp32 and at the precisions asked for
    for precision in ["fp32", *args.udf_precisions]:
        vectors, seconds = udf_embed(spark, queries, precision, args.partitions, args.home / "embed_udf")
        precisions.setdefault(precision, {}).update(
            {"udf_items_per_s": len(queries) / seconds, "udf_gflops": flops / seconds / 1e9, "udf_seconds": seconds})
        if precision == "fp32":
            precisions[precision]["max_abs_diff_vs_plain"] = float(np.abs(vectors - plain_vectors).max())
        print(f"udf {precision}: {len(queries) / seconds:.1f} captions/s, {flops / seconds / 1e9:.1f} GFLOP/s",
              file=sys.stderr)
    result.update({"agreement_queries": len(q_sub), "agreement_scenes": len(s_sub), "precisions": precisions,
                   "udf_items_per_s": precisions["fp32"]["udf_items_per_s"],
                   "udf_gflops": precisions["fp32"]["udf_gflops"]})
    kept = [p for p in args.precisions if precisions[p]["top1_agreement"] >= 0.99 and "udf_items_per_s" in precisions[p]]
    best = max(kept, key=lambda p: precisions[p]["udf_items_per_s"]) if kept else None
    result["quantized_precision"] = best
    result["quantized_items_per_s"] = precisions[best]["udf_items_per_s"] if best else None
    result["quantized_top1_agreement"] = precisions[best]["top1_agreement"] if best else None
    result["precisions_failing_agreement"] = [p for p in args.precisions if precisions[p]["top1_agreement"] < 0.99]
    return result


# ---------------------------------------------------------------------------------------------------- retrieval
def clustered_unit_vectors(rng: np.random.Generator, count: int, centres: np.ndarray, spread: float,
                           chunk: int = 200_000) -> np.ndarray:
    """Unit vectors around unit ``centres`` with noise of norm ~``spread`` (float32, made in chunks)."""
    dim = centres.shape[1]
    out = np.empty((count, dim), dtype=np.float32)
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        picked = centres[rng.integers(0, len(centres), n)]
        v = picked + (spread / np.sqrt(dim)) * rng.standard_normal((n, dim), dtype=np.float32)
        out[start:start + n] = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out


def search_all(index, queries: np.ndarray, k: int, chunk: int = 50_000) -> np.ndarray:
    """Scene ids (as row numbers) of the top-k of every query through ``SceneIndex.search``, -1 where fewer."""
    out = np.full((len(queries), k), -1, dtype=np.int64)
    for start in range(0, len(queries), chunk):
        hits = index.search(queries[start:start + chunk], top_k=k, min_similarity=-1.0)
        out[start + hits["query_row"].to_numpy(), hits["rank"].to_numpy() - 1] = hits["scene_id"].astype(
            np.int64).to_numpy()
    return out


def recall_at(exact: np.ndarray, approx: np.ndarray) -> float:
    k = exact.shape[1]
    found = sum(len(np.intersect1d(e[e >= 0], a[a >= 0], assume_unique=True)) for e, a in zip(exact, approx))
    return found / float((exact >= 0).sum() or 1) if k else 0.0


def search_settings(index, args, max_nprobe: int | None = None) -> list:
    """``index`` as built (conf's nprobe / ef_search), then the same index at each other ``--ivf-nprobes`` (up to
    ``max_nprobe``) or ``--hnsw-ef-searches`` value (:meth:`SceneIndex.with_search_params`); a flat index alone."""
    if index.index_type == "ivf":
        return [index] + [index.with_search_params(nprobe=p) for p in args.ivf_nprobes
                          if p != index.params["nprobe"] and (max_nprobe is None or p <= max_nprobe)]
    if index.index_type == "hnsw":
        return [index] + [index.with_search_params(ef_search=e) for e in args.hnsw_ef_searches
                          if e != index.params["ef_search"]]
    return [index]


def part_retrieval(args) -> dict:
    from jobs.platform.config import load_config
    from models.scene_index import build_scene_index

    conf = load_config("local").retrieve.index
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((args.clusters, args.dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    scenes = clustered_unit_vectors(rng, args.scenes, centres, args.spread)
    queries = clustered_unit_vectors(rng, args.queries, centres, args.spread)
    ids = np.array([str(i) for i in range(args.scenes)], dtype=object)
    result: dict[str, Any] = {"queries": args.queries, "scenes": args.scenes, "dim": args.dim, "k": 10,
                              "vectors": f"clustered random unit vectors ({args.clusters} centres, noise norm "
                                         f"{args.spread}), not model output", "indexes": {}}
    top: dict[str, np.ndarray] = {}
    for kind in ("flat", "ivf", "hnsw"):
        started = time.perf_counter()
        index = build_scene_index(scenes, ids, kind, nlist=conf.nlist, nprobe=conf.nprobe, hnsw_m=conf.hnsw_m,
                                  ef_search=conf.ef_search, ef_construction=conf.ef_construction)
        built = time.perf_counter() - started
        print(f"{kind}: built in {built:.1f} s", file=sys.stderr)
        settings = search_settings(index, args)
        for setting in settings:
            params = setting.params
            started = time.perf_counter()
            top[_setting_name(kind, params)] = search_all(setting, queries, 10)
            searched = time.perf_counter() - started
            result["indexes"][_setting_name(kind, params)] = {
                "kind": kind, "build_s": built, "search_s": searched, "seconds": built + searched,
                "params": params, "conf_default": params == index.params}
            print(f"{_setting_name(kind, params)}: search {searched:.1f} s", file=sys.stderr)
        del index, settings, setting
    exact = top.pop("flat")
    for name, found in top.items():
        entry = result["indexes"][name]
        entry["recall_at_10"] = recall_at(exact, found)
        entry["speedup_vs_exact"] = result["indexes"]["flat"]["seconds"] / entry["seconds"]
        print(f"{name}: recall@10 {entry['recall_at_10']:.4f}, {entry['speedup_vs_exact']:.1f}x exact",
              file=sys.stderr)
    qualified = [n for n in top if result["indexes"][n]["recall_at_10"] >= 0.95] or list(top)
    best = max(qualified, key=lambda n: result["indexes"][n]["speedup_vs_exact"])
    result.update({"approx_index": best, "approx_rule": "the fastest setting with recall@10 >= 0.95",
                   "exact_s": result["indexes"]["flat"]["seconds"], "approx_s": result["indexes"][best]["seconds"],
                   "approx_recall_at_10": result["indexes"][best]["recall_at_10"]})
    return result


DESCRIPTION_ID_PREFIX = "desc-"
"""Caption ids of the scene descriptions that ``retrieve.train_descriptions_as_queries`` embeds as factual items
(:func:`jobs.platform.tables.query_captions`): scenes here, not factual queries."""


def home_vectors(home: Path, schema: str, encoder_version: str | None) -> dict[str, Any]:
    """The text vectors of an ERG home's ``embeddings`` table (written by ``erg embed``), read with delta-rs
    (``deltalake``) where it is installed, else with Spark: ``scenes`` (the stylized captions and the scene
    descriptions), ``queries`` (the factual captions of P), the encoder version and how they were read."""
    os.environ["ERG_HOME"] = str(home.resolve())
    from jobs.platform.config import load_config
    from jobs.platform.tables import table_location

    cfg = load_config("local", {"tables": {"schema": schema}})
    location = table_location(cfg, "embeddings")
    columns = ["item_id", "item_kind", "modality", "encoder_version", "vector"]
    try:
        from deltalake import DeltaTable

        frame = DeltaTable(location).to_pandas(columns=columns, filters=[("modality", "=", "text")])
        reader = f"deltalake (delta-rs) at {location}"
    except ImportError:
        from jobs.platform.spark import get_spark
        from jobs.platform.tables import read_table

        frame = read_table(get_spark(cfg), cfg, "embeddings").where("modality = 'text'").select(*columns).toPandas()
        reader = f"Spark, table {cfg.tables.schema_name}.embeddings"
    if frame.empty:
        raise SystemExit(f"no text vectors in {location}: run `erg embed` on that home first")
    versions = frame[frame.item_kind == "scene"].encoder_version.value_counts()
    version = encoder_version or (versions.index[0] if len(versions) else frame.encoder_version.iloc[0])
    frame = frame[frame.encoder_version == version].sort_values("item_id", kind="stable")
    description = frame.item_id.str.startswith(DESCRIPTION_ID_PREFIX)

    def stacked(rows: pd.DataFrame) -> np.ndarray:
        return np.ascontiguousarray(np.stack(rows.vector.to_numpy()).astype(np.float32)) if len(rows) else \
            np.empty((0, 0), np.float32)

    stylized = frame[frame.item_kind == "scene"]
    descriptions = frame[(frame.item_kind == "factual") & description]
    factual = frame[(frame.item_kind == "factual") & ~description]
    return {"scenes": np.concatenate([stacked(stylized), stacked(descriptions)]) if len(descriptions)
            else stacked(stylized), "queries": stacked(factual), "encoder_version": version, "reader": reader,
            "stylized_captions": len(stylized), "scene_descriptions": len(descriptions),
            "factual_captions": len(factual), "encoder_versions_in_table": int(frame.encoder_version.nunique())}


def jittered(rng: np.random.Generator, sources: np.ndarray, count: int, sigma: float, keep_sources: bool,
             chunk: int = 100_000) -> tuple[np.ndarray, float]:
    """``count`` unit vectors: the ``sources`` themselves first where ``keep_sources``, then copies of them in
    turn, each with N(0, sigma^2) added per component and renormalised; and the copies' mean cosine to their
    source."""
    out = np.empty((count, sources.shape[1]), dtype=np.float32)
    start = min(len(sources), count) if keep_sources else 0
    out[:start] = sources[:start]
    cosines = []
    for begin in range(start, count, chunk):
        rows = np.arange(begin, min(begin + chunk, count)) % len(sources)
        noisy = sources[rows] + sigma * rng.standard_normal((len(rows), sources.shape[1]), dtype=np.float32)
        noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
        cosines.append((noisy * sources[rows]).sum(axis=1))
        out[begin:begin + len(rows)] = noisy
    return out, float(np.concatenate(cosines).mean()) if cosines else 1.0


def timed_search(index, queries: np.ndarray, k: int, chunk: int = 65_536) -> tuple[np.ndarray, float]:
    """Rows of the top-k of every query by Faiss ``index.search`` (all threads, in chunks), and the seconds."""
    rows = np.empty((len(queries), k), dtype=np.int64)
    started = time.perf_counter()
    for begin in range(0, len(queries), chunk):
        rows[begin:begin + chunk] = index.search(queries[begin:begin + chunk], k)[1]
    return rows, time.perf_counter() - started


def part_retrieval_real(args) -> dict:
    """Approximate search on the real MiniLM vectors of ``--home`` (:func:`home_vectors`): :func:`retrieval_real`."""
    return retrieval_real(args, home_vectors(args.home, args.schema, args.encoder_version))


def retrieval_real(args, real: dict[str, Any]) -> dict:
    """Approximate search at ``--real-scenes`` x ``--real-queries`` built from ``real`` (:func:`home_vectors`'s
    dict): the product's ``auto`` choice (:func:`models.scene_index.tune_scene_index`) and every rung of the HNSW /
    IVF ladders against exact flat search, all timed in this run (see the module docstring)."""
    import faiss

    from jobs.platform.config import load_config
    from models.scene_index import (
        EF_SEARCH_LADDER,
        NPROBE_LADDER,
        SEARCH_PARAMS,
        TUNING_K,
        build_scene_index,
        recall_per_query,
        tune_scene_index,
    )

    conf = load_config("local").retrieve.index
    k = TUNING_K
    if len(real["queries"]) == 0 or len(real["scenes"]) == 0:
        raise SystemExit(f"{args.home}: the embeddings table holds {len(real['scenes'])} scene and "
                         f"{len(real['queries'])} factual text vectors; both are needed")
    rng = np.random.default_rng(args.seed)
    scenes, scene_cosine = jittered(rng, real["scenes"], args.real_scenes, args.scene_jitter, keep_sources=True)
    queries, query_cosine = jittered(rng, real["queries"], args.real_queries, args.jitter, keep_sources=False)
    n_queries = len(queries)
    order = rng.permutation(n_queries)
    held = np.sort(order[:min(args.recall_queries, n_queries)])
    tune_rows = np.sort(order[len(held):len(held) + conf.tune_queries])
    ids = np.array([str(i) for i in range(len(scenes))], dtype=object)
    dim = scenes.shape[1]
    print(f"retrieval_real: {len(scenes):,} scenes ({len(real['scenes']):,} real) x {n_queries:,} queries "
          f"({len(real['queries']):,} real), jitter {args.jitter} (mean cosine {query_cosine:.4f})", file=sys.stderr)
    result: dict[str, Any] = {
        "home": str(args.home), "reader": real["reader"], "encoder_version": real["encoder_version"],
        "vectors": "all-MiniLM-L6-v2 text vectors of the home's embeddings table (erg embed)",
        "real_scenes": {"stylized_captions": real["stylized_captions"],
                        "scene_descriptions": real["scene_descriptions"]},
        "real_queries": real["factual_captions"], "scenes": len(scenes), "queries": n_queries, "dim": dim, "k": k,
        "seed": args.seed,
        "scene_top_up": f"the real scene vectors, then jittered copies of them in turn up to {len(scenes):,}",
        "scene_jitter_sigma": args.scene_jitter, "scene_copies_mean_cosine_to_source": scene_cosine,
        "query_build": f"each real factual vector copied in turn with a Gaussian jitter, renormalised, up to "
                       f"{n_queries:,}", "jitter_sigma": args.jitter, "mean_cosine_to_source": query_cosine,
        "recall_queries": len(held), "tune_queries": len(tune_rows),
        "timed": "faiss index.search of the queries, top 10, in chunks of 65,536, on all threads "
                 f"({faiss.omp_get_max_threads()}); the hit frames of SceneIndex.search are not included",
        "threads": faiss.omp_get_max_threads(),
    }
    # exact flat search: every query, or a fixed subset scaled linearly
    started = time.perf_counter()
    flat = faiss.IndexFlatIP(dim)
    flat.add(scenes)
    exact_build = time.perf_counter() - started
    exact_rows_n = n_queries if args.exact_queries is None else min(args.exact_queries, n_queries)
    rows, exact_search = timed_search(flat, queries if exact_rows_n == n_queries
                                      else queries[np.sort(order[:exact_rows_n])], k)
    if exact_rows_n == n_queries:
        truth = rows[held]
    else:
        truth = timed_search(flat, queries[held], k)[0]
        exact_search *= n_queries / exact_rows_n
    del rows
    result["exact"] = {"build_s": exact_build, "search_s": exact_search, "timed_queries": exact_rows_n,
                       "scaled_linearly": exact_rows_n != n_queries,
                       "ms_per_query": 1000 * exact_search / n_queries}
    print(f"exact: {exact_search:.1f} s for {n_queries:,} queries"
          + (f" (timed on {exact_rows_n:,}, scaled)" if exact_rows_n != n_queries else ""), file=sys.stderr)

    # the product's choice: retrieve.index.type auto, tuned on a query sample apart from the held ones
    exact_max_items = conf.exact_max_items if args.exact_max_items is None else args.exact_max_items
    min_speedup = conf.min_speedup if args.min_speedup is None else args.min_speedup
    started = time.perf_counter()
    chosen, tuning = tune_scene_index(scenes, ids, queries[tune_rows], target_recall=conf.target_recall,
                                      exact_max_items=exact_max_items, min_speedup=min_speedup, nlist=conf.nlist,
                                      hnsw_m=conf.hnsw_m, ef_construction=conf.ef_construction,
                                      gpu_search=False)
    tune_s = time.perf_counter() - started
    rows, chosen_search = timed_search(chosen.faiss_index, queries, k)
    chosen_recall = float(recall_per_query(truth, rows[held]).mean())
    del rows
    result["auto"] = {
        "index_type": tuning.index_type, "params": tuning.params, "search_param": tuning.search_param,
        "reason": tuning.reason, "fallback": tuning.fallback, "target_recall": tuning.target_recall,
        "exact_max_items": exact_max_items, "min_speedup": min_speedup,
        "sample_recall_at_10": tuning.recall_at_k, "sample_speedup_vs_exact": tuning.speedup_vs_exact,
        "tune_s": tune_s, "build_s": tuning.build_seconds.get(tuning.index_type, exact_build),
        "candidate_build_s": tuning.build_seconds,
        "trials": [{"index_type": t.index_type, "params": t.params, "recall_at_10": t.recall_at_k,
                    "recall_lower_bound": t.recall_lower_bound, "sample_search_s": t.search_seconds}
                   for t in tuning.trials],
        "search_s": chosen_search, "recall_at_10": chosen_recall,
        "speedup_vs_exact": exact_search / chosen_search,
        "speedup_vs_exact_with_build": (exact_build + exact_search) / (
            tuning.build_seconds.get(tuning.index_type, exact_build) + chosen_search),
        "speedup_vs_exact_with_tuning": (exact_build + exact_search) / (tune_s + chosen_search),
    }
    print(f"auto: {tuning.index_type} {tuning.search_param} ({tuning.reason}): recall@10 {chosen_recall:.4f} on "
          f"{len(held):,} held queries, {result['auto']['speedup_vs_exact']:.1f}x exact search", file=sys.stderr)

    # every rung of both ladders: recall on the held queries, search time on a fixed subset scaled to all queries
    sweep_rows = np.sort(order[:min(args.sweep_time_queries, n_queries)])
    # exact and the chosen setting timed in turn on one subset (exact, chosen, exact, chosen): the ratio of the two
    # sums does not depend on when in the run the machine was busier
    turns = {"exact": [], "chosen": []}
    for _ in range(2):
        turns["exact"].append(timed_search(flat, queries[sweep_rows], k)[1])
        turns["chosen"].append(timed_search(chosen.faiss_index, queries[sweep_rows], k)[1])
    result["interleaved"] = {"queries": len(sweep_rows), "exact_s": turns["exact"], "chosen_s": turns["chosen"],
                             "speedup_vs_exact": sum(turns["exact"]) / sum(turns["chosen"])}
    print(f"interleaved on {len(sweep_rows):,} queries: exact {turns['exact']} s, chosen {turns['chosen']} s: "
          f"{result['interleaved']['speedup_vs_exact']:.1f}x", file=sys.stderr)
    flat_sub = sum(turns["exact"]) / len(turns["exact"]) * n_queries / len(sweep_rows)  # the ladder's exact
    del flat
    sweep: dict[str, Any] = {}
    for kind in ("hnsw", "hnsw_sq8", "ivf"):
        if kind == tuning.index_type:
            built, index = result["auto"]["build_s"], chosen
        else:
            started = time.perf_counter()
            index = build_scene_index(scenes, ids, kind, nlist=max(1, min(conf.nlist, len(scenes) // 39)),
                                      nprobe=1, hnsw_m=conf.hnsw_m, ef_search=EF_SEARCH_LADDER[0],
                                      ef_construction=conf.ef_construction)
            built = time.perf_counter() - started
        ladder = (EF_SEARCH_LADDER if kind != "ivf"
                  else [p for p in NPROBE_LADDER if p <= index.params["nlist"]])
        for value in ladder:
            setting = index.with_search_params(**{SEARCH_PARAMS[kind]: value})
            recall = float(recall_per_query(truth, timed_search(setting.faiss_index, queries[held], k)[0]).mean())
            projected = timed_search(setting.faiss_index, queries[sweep_rows], k)[1] * n_queries / len(sweep_rows)
            name = _setting_name(kind, setting.params)
            sweep[name] = {"kind": kind, "params": setting.params, "recall_at_10": recall, "build_s": built,
                           "projected_search_s": projected, "speedup_vs_exact": flat_sub / projected}
            print(f"  {name}: recall@10 {recall:.4f}, {flat_sub / projected:.1f}x exact", file=sys.stderr)
            del setting
            if recall >= args.sweep_stop_recall:
                break
        del index
    qualified = {n: e for n, e in sweep.items() if e["recall_at_10"] >= conf.target_recall}
    fastest = max(qualified, key=lambda n: qualified[n]["speedup_vs_exact"]) if qualified else None
    result["sweep"] = {"settings": sweep, "time_queries": len(sweep_rows),
                       "timed": "recall on the held queries; search seconds on a fixed subset of the queries, "
                                "scaled to all of them, against exact search of the same subset",
                       "fastest_meeting_target": fastest}
    result.update({"chosen": _setting_name(tuning.index_type, tuning.params),
                   "recall_at_10": chosen_recall, "speedup_vs_exact": result["auto"]["speedup_vs_exact"],
                   "speedup_vs_exact_with_build": result["auto"]["speedup_vs_exact_with_build"],
                   "exact_s": exact_search, "chosen_search_s": chosen_search})
    return result


def _setting_name(kind: str, params: dict[str, int]) -> str:
    """``flat``, ``ivf1024/nprobe8``, ``hnsw32/efc200/ef64``: an index and its search setting."""
    if kind == "ivf":
        return f"ivf{params['nlist']}/nprobe{params['nprobe']}"
    if kind in ("hnsw", "hnsw_sq8"):
        return (f"hnsw{params['hnsw_m']}{'sq8' if kind == 'hnsw_sq8' else ''}/efc{params['ef_construction']}"
                f"/ef{params['ef_search']}")
    return kind


# -------------------------------------------------------------------------------------------------------- sizes
def size_config(args, size: int, master: str, schema: str | None = None):
    from jobs.platform.config import load_config

    schema = schema or f"scale_{size}"
    overrides = {
        "tables": {"schema": schema},
        "sample": {"n_images": args.images, "factual_captions": size, "stylized_per_style": args.stylized_per_style,
                   "dir": f"{os.environ['ERG_HOME']}/samples/{schema}", "bad_rows": False},
        "spark": {"master": master, "show_progress": False, "shuffle_partitions": 8,
                  "extra": {"spark.executor.memory": args.executor_memory, "spark.cores.max": "2",
                            **({"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(args.event_log)}
                               if args.event_log else {})}},
        "retrieve": {"partitions": 8},
    }
    return load_config("local", overrides)


def timed(label: str, fn) -> tuple[Any, float]:
    started = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - started
    print(f"  {label}: {seconds:.1f} s", file=sys.stderr)
    return out, seconds


def copy_factual_vectors(spark, cfg, source_cfg) -> int:
    """The factual vectors of ``cfg``'s captions, copied from ``source_cfg``'s embeddings of the same caption text
    (same encoder version); returns the rows inserted. All in Spark: nothing goes to the driver."""
    from pyspark.sql import functions as F

    from jobs.platform.tables import merge_rows, read_table
    from jobs.vocabulary import encoder_spec
    from udfs.embedding import encoder_identity

    identity = encoder_identity(encoder_spec(cfg))
    by_text = (read_table(spark, source_cfg, "embeddings")
               .where((F.col("item_kind") == "factual") & (F.col("encoder_version") == identity.version))
               .join(read_table(spark, source_cfg, "factual_captions")
                     .select(F.col("caption_id").alias("item_id"), "caption"), "item_id")
               .groupBy("caption").agg(F.first("vector").alias("vector")))
    rows = (read_table(spark, cfg, "factual_captions").select(F.col("caption_id").alias("item_id"), "caption")
            .join(by_text, "caption")
            .select("item_id", F.lit("factual").alias("item_kind"), F.lit("text").alias("modality"), "vector",
                    F.lit(identity.name).alias("encoder"), F.lit(identity.version).alias("encoder_version"),
                    F.lit("scale-benchmark-copy").alias("run_id"), F.current_timestamp().alias("created_at")))
    return merge_rows(spark, cfg, "embeddings", rows)["inserted"]


def warm_up(args, master: str, size: int) -> None:
    """Ingest, embed and retrieve ``size`` factual captions in a schema of their own, not measured: the session's
    first jobs load classes and start Python workers, which a measured step must not pay for."""
    from benchmarks.e2e_cost import fresh_schema as fresh
    import jobs
    from jobs.sample import write_sample
    from jobs.platform.spark import get_spark

    warm = size_config(args, size, master, schema="scale_warmup")
    fresh(warm)
    write_sample(warm)
    spark = get_spark(warm)
    print(f"## warm-up on {size:,} factual captions (not measured)", file=sys.stderr)
    for job in (jobs.ingest, jobs.embed, jobs.retrieve):
        job(spark, warm)


def part_sizes(args, master: str) -> tuple[dict, dict]:
    from benchmarks.e2e_cost import fresh_schema as fresh
    import jobs
    from jobs.sample import write_sample
    from jobs.platform.spark import get_spark
    from jobs.platform.tables import read_table

    configs = {n: size_config(args, n, master) for n in args.sizes}
    for cfg in configs.values():
        fresh(cfg)
    spark = get_spark(configs[args.sizes[0]])
    warm_up(args, master, min(args.sizes[0], args.warmup_size))
    out: dict[str, Any] = {}
    previous = None
    for n, cfg in configs.items():
        print(f"## {n:,} factual captions", file=sys.stderr)
        write_sample(cfg)
        get_spark(cfg)
        counts, ingest_s = timed("ingest", lambda: jobs.ingest(spark, cfg))
        if n in args.copy_vectors_at and previous is not None:
            copied, copy_s = timed("factual vectors copied by caption text", lambda: copy_factual_vectors(
                spark, cfg, previous))
            embedded, embed_s = timed("embed (scenes and images)", lambda: jobs.embed(spark, cfg))
            embed_s += copy_s
            vectors = f"factual vectors copied by caption text from the {previous.tables.schema_name} run " \
                      f"({copied:,} rows); scenes and images by the embed UDF ({embedded['encoded']:,} items)"
        else:
            embedded, embed_s = timed("embed", lambda: jobs.embed(spark, cfg))
            vectors = f"embed UDF ({embedded['encoded']:,} items)"
        hits, retrieve_s = timed("retrieve", lambda: jobs.retrieve(spark, cfg))
        factual = read_table(spark, cfg, "factual_captions").count()
        out[str(n)] = {"factual_captions": factual, "ingest_s": ingest_s, "embed_s": embed_s,
                       "retrieve_s": retrieve_s, "vectors": vectors, "embed_encoded": embedded["encoded"],
                       "retrievals_inserted": hits.get("retrievals.inserted"),
                       "items_per_s": factual / (ingest_s + retrieve_s),
                       "items_per_s_with_embed": factual / (ingest_s + embed_s + retrieve_s)}
        previous = cfg
    return out, {"images": args.images, "stylized_per_style": args.stylized_per_style,
                 "corpus": "the sample's generator (jobs.sample), factual captions spread over the images"}


def per_item_cost(sizes: dict) -> dict:
    """Per-item cost (ingest + retrieve) at the largest size over the smallest, of all sizes measured so far."""
    first, last = min(sizes, key=int), max(sizes, key=int)
    ratio = sizes[first]["items_per_s"] / sizes[last]["items_per_s"]
    print(f"per-item cost (ingest + retrieve) at {last} / at {first}: {ratio:.2f}", file=sys.stderr)
    return {"per_item_cost_ratio_largest_vs_smallest": ratio,
            "per_item_cost_counts": "ingest + retrieve (each size's embed: see its vectors)"}


# -------------------------------------------------------------------------------------------------- incremental
def one_percent_new(cfg, factual_now: int) -> tuple[list, int, int]:
    """Extra ingest sources, written beside the sample: 1% new factual captions (new text on the Flickr images
    without stylized captions, so they join P) and 1% new stylized captions (new FlickrStyle humor lines on the
    stylized images). Returns (sources, new factual, new stylized)."""
    import random

    from jobs.platform.config import IngestSource
    from jobs.sample import HUMOR_PHRASES, factual_caption, sample_scene

    root = Path(cfg.sample.dir) / "new"
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(99)
    images = sorted(p.name for p in (Path(cfg.sample.dir) / "images").glob("1*_*.png"))
    styled, unstyled = images[:cfg.sample.stylized_per_style], images[cfg.sample.stylized_per_style:]

    def text(name: str) -> str:
        scene = sample_scene(int(name.split("_")[0]) - 1000000, rng)
        return factual_caption(rng, scene["subject"], scene["action"], scene["place"], scene["color"])

    n_factual = max(1, factual_now // 100)
    lines = [f"{unstyled[k % len(unstyled)]}#{100000 + k}\t{text(unstyled[k % len(unstyled)])} at dusk number {k} ."
             for k in range(n_factual)]
    (root / "factual_new.txt").write_text("\n".join(lines) + "\n")
    n_stylized = max(1, 4 * cfg.sample.stylized_per_style // 100)
    picked = [styled[k % len(styled)] for k in range(n_stylized)]
    humor = [f"{text(name)} {rng.choice(HUMOR_PHRASES)} on day {k} ." for k, name in enumerate(picked)]
    (root / "funny_new.txt").write_text("\n".join(humor) + "\n")
    (root / "image_names_new.txt").write_text("\n".join(picked) + "\n")
    images_dir = str(Path(cfg.sample.dir) / "images")
    return [IngestSource(format="flickr30k_tokens", path=str(root / "factual_new.txt"), name="new_flickr30k",
                         image_root=images_dir),
            IngestSource(format="flickrstyle", style="humor", path=str(root / "funny_new.txt"),
                         image_names=str(root / "image_names_new.txt"), name="new_flickrstyle",
                         image_root=images_dir)], n_factual, n_stylized


def part_incremental(args, master: str, sizes_result: dict) -> dict:
    import jobs
    from jobs.platform.spark import get_spark
    from jobs.sample import sample_sources

    size = args.incremental_size
    full = sizes_result.get(str(size))
    if full is None:
        raise SystemExit(f"--parts incremental needs the sizes part's {size:,} run (in this run or scale.json)")
    if not full["vectors"].startswith("embed UDF"):
        raise SystemExit(f"the {size:,} run copied its factual vectors ({full['vectors']}): that is not a full "
                         f"run's cost; measure the size with --copy-vectors-at ''")
    if "sizes" not in args.parts:  # a session of its own: warmed up as the sizes part's is
        warm_up(args, master, args.warmup_size)
    cfg = size_config(args, size, master)
    spark = get_spark(cfg)
    extra, n_factual, n_stylized = one_percent_new(cfg, full["factual_captions"])
    print(f"## incremental: {n_factual} new factual, {n_stylized} new stylized captions on {size:,}", file=sys.stderr)
    counts, ingest_s = timed("ingest", lambda: jobs.ingest(spark, cfg, sample_sources(cfg) + extra))
    embedded, embed_s = timed("embed", lambda: jobs.embed(spark, cfg))
    hits, retrieve_s = timed("retrieve (incremental)", lambda: jobs.retrieve(spark, cfg, incremental=True))
    full_s = full["ingest_s"] + full["embed_s"] + full["retrieve_s"]
    new_s = ingest_s + embed_s + retrieve_s
    print(f"incremental / full: {new_s / full_s:.3f}", file=sys.stderr)
    return {"size": size, "new_factual": n_factual, "new_stylized": n_stylized, "full_s": full_s,
            "full_vectors": full["vectors"],
            "ingested": {k: v for k, v in counts.items() if k.startswith(("rows.", "factual_captions.",
                                                                         "stylized_captions."))},
            "one_percent_new_s": new_s, "ratio": new_s / full_s,
            "steps_s": {"ingest": ingest_s, "embed": embed_s, "retrieve": retrieve_s},
            "embed_encoded": embedded["encoded"],
            "embed_steps_s": {k.split(".", 1)[1]: v for k, v in embedded.items() if k.startswith("seconds.")},
            "retrieve": {k: v for k, v in hits.items() if isinstance(v, (int, float, str))}}


# ----------------------------------------------------------------------------------------------------- generate
def part_generate(args) -> dict:
    """Generator UDF vs plain loop over the same candidates of an existing ERG home; the UDF twice in the same run,
    on the plain decoding path (``generate.decoding.fast: false``) and on the fast one (the default): captions/s of
    each and the share of captions they write alike."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from jobs.generate import candidates, decoding_options
    from jobs.platform.config import load_config
    from jobs.platform.model_store import require_current
    from jobs.platform.spark import get_spark
    from models.generator import generate, load_generator
    from udfs.generation import make_generator, transfer_phrases

    os.environ["ERG_HOME"] = str(Path(args.generate_home).resolve())
    cfg = load_config(args.generate_conf, {"spark": {"show_progress": False},
                                           "generate": {"max_candidates": None, "max_candidates_per_style": None}})
    spark = get_spark(cfg)
    current = require_current(cfg, "generator", "generate")
    # the current version has generated them all: read candidates as for a version that has not
    cand = candidates(spark, cfg, "scale-benchmark").orderBy(F.xxhash64("query_id", "scene_id", "retrieval_type"))
    picked = cand.limit(args.generate_candidates).cache()
    frame = picked.toPandas()  # bounded by --generate-candidates
    n = len(frame)
    options = decoding_options(cfg)
    sdf = picked.repartition(args.partitions)
    schema = StructType([f for f in picked.schema.fields if f.name not in ("phrase_tokens", "phrase_mask")])
    schema = schema.add("transfer_phrase", "string").add("generated_caption", "string")

    def through_udf(fast: bool):
        udf = make_generator(current["path"], current["kind"], {**options, "fast": fast}, "cpu",
                             current["max_source_len"], current["max_target_len"], current.get("propensity_path"))
        picked.limit(args.partitions * 8).repartition(args.partitions).mapInPandas(udf, schema).count()  # warm-up
        started = time.perf_counter()
        out = sdf.mapInPandas(udf, schema).select("query_id", "scene_id", "retrieval_type",
                                                  "generated_caption").toPandas()
        return out, time.perf_counter() - started

    old, old_s = through_udf(False)
    got, udf_s = through_udf(True)
    both = old.merge(got, on=["query_id", "scene_id", "retrieval_type"], suffixes=("_old", ""))
    same_as_old = float((both["generated_caption_old"] == both["generated_caption"]).mean())
    gen = load_generator(current["kind"], current["path"], device="cpu", max_source_len=current["max_source_len"],
                         max_target_len=current["max_target_len"])
    phrases, clauses = transfer_phrases(frame, current.get("propensity_path"))
    todo = [bool(p) for p in phrases]  # as the UDF: a candidate without a transfer phrase is not generated
    started = time.perf_counter()
    written = generate(gen, [p for p, t in zip(phrases, todo) if t],
                       [f for f, t in zip(frame["factual_caption"], todo) if t], **options,
                       contiguous=[c for c, t in zip(clauses, todo) if t] if any(clauses) else None)
    plain_s = time.perf_counter() - started
    it = iter(written)
    plain = [next(it) if t else "" for t in todo]
    merged = frame[["query_id", "scene_id", "retrieval_type"]].assign(plain=plain).merge(
        got, on=["query_id", "scene_id", "retrieval_type"])
    same = float((merged["plain"] == merged["generated_caption"]).mean())
    print(f"generate: udf {n / udf_s:.2f} captions/s (plain path {n / old_s:.2f}, {old_s / udf_s:.2f}x, same text "
          f"{same_as_old:.4f}), plain loop {n / plain_s:.2f} captions/s, same text {same:.3f}", file=sys.stderr)
    clause_share = float(np.mean([c for c, t in zip(clauses, todo) if t])) if any(todo) else 0.0
    return {"candidates": n, "generated": sum(todo), "home": str(args.generate_home), "conf": args.generate_conf,
            "generator_version": current["version"], "udf_captions_per_s": n / udf_s,
            "udf_captions_per_s_plain_path": n / old_s, "speedup_vs_plain_path": old_s / udf_s,
            "same_text_share": same_as_old, "clause_share": clause_share,
            "loop_captions_per_s": n / plain_s, "udf_s": udf_s, "udf_plain_path_s": old_s, "loop_s": plain_s,
            "loop_same_text_share": same, "decoding": options}


# --------------------------------------------------------------------------------------------------------- main
def main() -> None:
    from benchmarks.e2e_cost import parse_sizes

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {PARTS}")
    parser.add_argument("--sizes", type=parse_sizes, default=[10000, 100000, 1000000],
                        help="factual corpus sizes, comma-separated")
    parser.add_argument("--copy-vectors-at", default="1000000", help="sizes whose factual vectors are copied")
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--stylized-per-style", type=int, default=100)
    parser.add_argument("--embed-items", type=int, default=10000)
    parser.add_argument("--precisions", default="int8,bf16", help="reduced precisions whose agreement is measured")
    parser.add_argument("--udf-precisions", default="int8", help="reduced precisions also run through the UDF")
    parser.add_argument("--agreement-queries", type=int, default=2000)
    parser.add_argument("--agreement-scenes", type=int, default=3000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--queries", type=int, default=1_000_000)
    parser.add_argument("--scenes", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--clusters", type=int, default=2000)
    parser.add_argument("--spread", type=float, default=0.7)
    parser.add_argument("--ivf-nprobes", type=parse_sizes, default=[2, 4, 8, 16],
                        help="IVF nprobe values searched besides conf's (one trained index)")
    parser.add_argument("--hnsw-ef-searches", type=parse_sizes, default=[32],
                        help="HNSW ef_search values searched besides conf's (one built graph)")
    parser.add_argument("--real-queries", type=int, default=1_000_000,
                        help="retrieval_real: queries, jittered copies of the home's real factual vectors")
    parser.add_argument("--real-scenes", type=int, default=100_000,
                        help="retrieval_real: scenes, the home's real scene vectors topped up with jittered copies")
    parser.add_argument("--jitter", type=float, default=0.01, help="retrieval_real: per-component sigma of the "
                        "queries' Gaussian jitter (0.01: mean cosine about 0.98 to the source at 384 dimensions)")
    parser.add_argument("--scene-jitter", type=float, default=0.01, help="retrieval_real: same, for the scene top-up")
    parser.add_argument("--recall-queries", type=int, default=10_000,
                        help="retrieval_real: held queries whose recall@10 against exact search is measured")
    parser.add_argument("--exact-queries", type=int, default=None, help="retrieval_real: time exact search on this "
                        "many queries and scale linearly (default: all of them)")
    parser.add_argument("--sweep-time-queries", type=int, default=100_000,
                        help="retrieval_real: queries each ladder rung is timed on (scaled to all)")
    parser.add_argument("--sweep-stop-recall", type=float, default=0.995,
                        help="retrieval_real: stop a ladder once a rung reaches this recall")
    parser.add_argument("--exact-max-items", type=int, default=None,
                        help="retrieval_real: auto's exact_max_items (default: the conf's)")
    parser.add_argument("--min-speedup", type=float, default=None,
                        help="retrieval_real: auto's min_speedup (default: the conf's)")
    parser.add_argument("--schema", default="erg", help="retrieval_real: the home's table schema")
    parser.add_argument("--encoder-version", default=None,
                        help="retrieval_real: the vectors' encoder version (default: the one most scenes have)")
    parser.add_argument("--seed", type=int, default=0, help="retrieval_real: jitter, held and tuning queries")
    parser.add_argument("--warmup-size", type=int, default=10000,
                        help="factual captions of the sizes part's warm-up (not measured), at most the first size")
    parser.add_argument("--incremental-size", type=int, default=100000)
    parser.add_argument("--generate-home", default=str(REPO / ".erg-real"))
    parser.add_argument("--generate-conf", default="shared_data")
    parser.add_argument("--generate-candidates", type=int, default=10000)
    parser.add_argument("--executor-memory", default="3g")
    parser.add_argument("--event-log", type=Path, default=None,
                        help="a folder for Spark's event log of the cluster parts (to read where a step's time goes)")
    parser.add_argument("--home", type=Path, default=REPO / ".erg" / "benchmarks" / "scale",
                        help="the ERG home: the cluster parts' own; retrieval_real reads the vectors of this one's "
                        "embeddings table (e.g. a real-data home after `erg embed --conf conf/shared_data.yaml`)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "scale.json")
    args = parser.parse_args()
    parts = args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}: choose from {PARTS}")
    args.copy_vectors_at = {int(s) for s in args.copy_vectors_at.split(",") if s}
    args.precisions = [p for p in args.precisions.split(",") if p]
    args.udf_precisions = [p for p in args.udf_precisions.split(",") if p]
    command = "python benchmarks/scale.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    result: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.setdefault("commands", {})
    import torch

    machine = {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__}

    def record(part: str, value: Any, key: str | None = None) -> None:
        result[key or part] = value
        result["commands"][part] = command
        result["machine"] = machine
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {part} to {args.out}", file=sys.stderr)

    if "kernels" in parts:
        record("kernels", matmul_gflops(), "matmul_gflops")
        print(f"fp32 matmul peak: {result['matmul_gflops']:.1f} GFLOP/s", file=sys.stderr)
    if "retrieval" in parts:
        record("retrieval", part_retrieval(args))
    if "retrieval_real" in parts:
        record("retrieval_real", part_retrieval_real(args))
    cluster_parts = [p for p in parts if p in ("embed", "sizes", "incremental")]
    if cluster_parts:
        from jobs.platform.spark import get_spark
        from jobs.platform.standalone_cluster import start_cluster

        args.home.mkdir(parents=True, exist_ok=True)
        os.environ["ERG_HOME"] = str(args.home.resolve())
        with start_cluster(args.home / "cluster", workers=2, cores=1,
                           memory=f"{int(args.executor_memory.rstrip('g')) + 1}g") as cluster:
            result["cluster"] = "standalone 1 master + 2 workers (1 core each)"
            if "embed" in parts:
                spark = get_spark(size_config(args, args.sizes[0], cluster.master_url, schema="scale_embed"))
                embed_result = part_embed(spark, args)
                embed_result["udf_vs_plain"] = embed_result["udf_items_per_s"] / embed_result["plain_items_per_s"]
                if "matmul_gflops" in result:
                    embed_result["udf_share_of_matmul_peak"] = embed_result["udf_gflops"] / result["matmul_gflops"]
                record("embed", embed_result)
            if "sizes" in parts:
                sizes, about = part_sizes(args, cluster.master_url)
                kept = result.get("sizes", {})  # sizes not measured now keep their entry and its command
                for entry in kept.values():
                    entry.setdefault("command", result["commands"].get("sizes"))
                for entry in sizes.values():
                    entry["command"] = command
                sizes = {**kept, **sizes}
                result["sizes_setup"] = {**about, **per_item_cost(sizes)}
                record("sizes", sizes)
            if "incremental" in parts:
                record("incremental", part_incremental(args, cluster.master_url, result["sizes"]))
            from pyspark.sql import SparkSession

            active = SparkSession.getActiveSession()
            if active is not None:
                active.stop()
    if "generate" in parts:
        record("generate", part_generate(args))


if __name__ == "__main__":
    main()
