"""``erg ingest``: the corpora's files -> stylized_captions, factual_captions, images, quarantine (Delta MERGE).

Parsing and the paper's protocol (splits by image, duplicates counted, P without the stylized images, whose
factual captions become their scene descriptions) are :mod:`readers.corpora` (pure pandas); this job only turns its
rows into DataFrames, stamps the MLflow run id and ingest time, and MERGEs on the natural keys, so re-ingesting
the same files adds nothing. An image already in ``stylized_captions`` keeps its split when new captions of it
land, and its new factual captions are descriptions, not P.

New files land, old ones are not read again (``ingest.skip_unchanged_sources``, like Auto Loader's file tracking):
a source whose files hash to what the last successful ingest wrote into these same tables (their Delta ids
match) is skipped, counted in ``sources.skipped_unchanged``. When the files read bring stylized captions of an
image not yet in ``stylized_captions``, every source is read after all (``sources.reread_for_new_stylized_images``),
so that the protocol sees them whole: the new images' splits, and their factual captions in old files turned into
scene descriptions. A row of a new file whose key is already in its table is counted in ``<table>.key_in_table``.

Every record accounted for: per source, ``read`` (records its reader counted) = ``kept`` (rows, scene descriptions
included) + ``quarantined`` + ``duplicates`` (by natural key); logged as ``source.<source>.{read,kept,quarantined,
duplicates}`` and in total as ``rows.*``, in ``ingest_sources.json``, and printed by ``erg ingest``
(:func:`summary_lines`); the natural keys of a sample of the duplicates, with file and line, in ``duplicates.json``.
A record that is in none of the three fails the ingest (``rows.unaccounted`` must be 0).

Also logged: per table ``read`` / ``kept`` / ``inserted``; ``stylized_captions.duplicates``,
``factual_captions.duplicates``, ``factual_captions.excluded_stylized_image`` (= ``images.descriptions``), stylized
rows and images per split; quarantine reasons in ``quarantine_reasons.json``.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from jobs import reports
from jobs.platform.config import ErgConfig, IngestSource
from jobs.platform.runner import JobContext, Step, run_job
from jobs.platform.tables import TABLES, merge_rows, table_name
from jobs.platform.watermarks import ingested_sources, record_ingested_sources
from jobs.sample import sample_exists, sample_sources, write_sample
from readers.corpora import ReadResult, Reader, duplicate_examples, origin_counts, prepare, stable_id, tag_rows

TIME_COLUMN = {"quarantine": "quarantined_at"}


#: the tables the ingest writes (their ids guard the record of which source files are in them)
INGEST_TABLES = ("stylized_captions", "factual_captions", "images", "quarantine")


def source_key(source: IngestSource) -> str:
    """A source's identity: its format, files and options (a change of any option makes it a new source)."""
    return json.dumps(source.model_dump(), sort_keys=True, default=str)


def source_fingerprint(source: IngestSource) -> str | None:
    """SHA-256 over the names and bytes of every file the source reads (its path, a folder's files, the image-name
    lists); None when one of them is not a local file or folder (then the source is always read)."""
    names = source.image_names if isinstance(source.image_names, list) else [source.image_names]
    files: list[Path] = []
    for name in [source.path, *(n for n in names if n)]:
        path = Path(name)
        if path.is_dir():
            files += sorted(f for f in path.rglob("*") if f.is_file())
        elif path.is_file():
            files.append(path)
        else:
            return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path).encode() + b"\0")
        with path.open("rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def read_sources(cfg: ErgConfig, sources: list[IngestSource],
                 known_stylized_images: set[str] | frozenset[str] = frozenset()) -> tuple[ReadResult, dict[str, dict]]:
    """Read every source and apply the protocol (:func:`readers.corpora.prepare`); returns the rows and per-source
    counts (:func:`readers.corpora.origin_counts`: read = kept + quarantined + duplicates)."""
    reader = Reader(cfg.styles, cfg.factual_label)
    total = ReadResult()
    for source in sources:
        options = source.model_dump(exclude={"format", "path"})
        result = reader.read(source.format, source.path, **options)
        total.extend(tag_rows(result, f"{source.name or source.format}:{source.path.rsplit('/', 1)[-1]}",
                              source.format))
    prepare(total, cfg.ingest.splits, known_stylized_images)
    return total, origin_counts(total)


def assign_splits(frame: pd.DataFrame, fractions: dict[str, float]) -> pd.DataFrame:
    """Rows without a split get train/val/test by a hash of their image id: one image, one split everywhere."""
    if "split" not in frame.columns or frame.empty or frame["split"].notna().all():
        return frame
    bounds = (fractions["train"], fractions["train"] + fractions["val"])

    def split_of(image_id: str) -> str:
        u = int(stable_id("split", image_id, length=8), 16) / 16 ** 8
        return "train" if u < bounds[0] else "val" if u < bounds[1] else "test"

    frame = frame.copy()
    missing = frame["split"].isna()
    frame.loc[missing, "split"] = frame.loc[missing, "image_id"].map(split_of)
    return frame


def _to_spark(spark: SparkSession, frame: pd.DataFrame, table: str, run_id: str, now: dt.datetime):
    spec = TABLES[table]
    frame = frame.copy()
    frame[TIME_COLUMN.get(table, "ingest_time")] = now
    frame["run_id"] = run_id
    for f in spec.schema.fields:
        if f.name not in frame.columns:
            frame[f.name] = None
    frame = frame[[f.name for f in spec.schema.fields]].astype(object).where(frame.notna(), None)
    return spark.createDataFrame(frame, schema=spec.schema)


def _existing_stylized(spark: SparkSession, cfg: ErgConfig) -> dict[str, str]:
    """image id -> split of the images already in ``stylized_captions`` (the most held-out split of its rows)."""
    name = table_name(cfg, "stylized_captions")
    if not spark.catalog.tableExists(name):
        return {}
    rank = F.when(F.col("split") == "test", 3).when(F.col("split") == "val", 2).when(F.col("split") == "train", 1)
    rows = (spark.table(name).groupBy("image_id").agg(F.max(rank).alias("r")).collect())
    return {r.image_id: {3: "test", 2: "val", 1: "train"}.get(r.r) for r in rows}


@dataclass
class IngestPlan:
    """What an ingest reads: the sources to read (``todo``) and those skipped as unchanged, what reading them gave
    (rows and per-source counts), the splits of the stylized images already ingested, and the sources' fingerprints.
    ``reread``: skipped sources read after all because the files bring new stylized images."""

    todo: list[IngestSource]
    skipped: list[IngestSource]
    result: ReadResult
    per_source: dict[str, dict]
    existing: dict[str, str]
    fingerprints: dict[str, str | None]
    reread: int = 0


def plan_ingest(spark: SparkSession, cfg: ErgConfig, sources: list[IngestSource]) -> IngestPlan:
    """Read the sources that changed since the last ingest (all of them when new stylized images land); RuntimeError
    before anything is written when a record is unaccounted for."""
    existing = _existing_stylized(spark, cfg)
    fingerprints = {source_key(s): source_fingerprint(s) for s in sources}
    done = ingested_sources(spark, cfg, INGEST_TABLES) if cfg.ingest.skip_unchanged_sources else {}
    skipped = [s for s in sources if fingerprints[source_key(s)] is not None
               and done.get(source_key(s)) == fingerprints[source_key(s)]]
    todo = [s for s in sources if s not in skipped]
    result, per_source = read_sources(cfg, todo, known_stylized_images=set(existing))
    plan = IngestPlan(todo, skipped, result, per_source, existing, fingerprints)
    if skipped and {r["image_id"] for r in result.stylized} - set(existing):
        # the protocol over every source: the new stylized images' splits, and their factual captions in the
        # skipped files become scene descriptions
        plan.reread, plan.skipped, plan.todo = len(skipped), [], sources
        plan.result, plan.per_source = read_sources(cfg, sources, known_stylized_images=set(existing))
    lost = {name: c["unaccounted"] for name, c in plan.per_source.items() if c["unaccounted"]}
    if lost:  # before anything is written
        raise RuntimeError(f"ingest lost track of records (read - kept - quarantined - duplicates per source: "
                           f"{lost}); this is a bug in readers.corpora")
    return plan


def table_frames(plan: IngestPlan, fractions: dict[str, float]) -> tuple[dict[str, pd.DataFrame], int]:
    """The rows per table, splits assigned (an image already ingested keeps its split); and how many stylized rows
    took their split from the table."""
    frames = {table: assign_splits(frame, fractions) for table, frame in plan.result.frames().items()}
    stylized = frames["stylized_captions"]
    if not plan.existing or stylized.empty:
        return frames, 0
    before = stylized["split"].copy()
    stylized["split"] = stylized["image_id"].map(plan.existing).fillna(stylized["split"])
    frames["stylized_captions"] = stylized
    return frames, int((before != stylized["split"]).sum())


def table_counts(table: str, frame: pd.DataFrame, inserted: int) -> dict[str, int]:
    """``<table>.kept`` / ``.inserted`` (and ``.key_in_table``); the stylized rows and images per split."""
    counts = {f"{table}.kept": len(frame), f"{table}.inserted": inserted}
    if table in ("stylized_captions", "factual_captions"):  # e.g. a new file repeating ingested rows
        counts[f"{table}.key_in_table"] = len(frame) - inserted
    if table == "stylized_captions":
        for split, n in frame["split"].value_counts().items():
            counts[f"stylized_captions.split.{split}"] = int(n)
        for split, n in frame.drop_duplicates("image_id")["split"].value_counts().items():
            counts[f"stylized_captions.images.{split}"] = int(n)
    return counts


def write_tables(spark: SparkSession, cfg: ErgConfig, frames: dict[str, pd.DataFrame], plan: IngestPlan,
                 run_id: str) -> dict[str, int]:
    """MERGE every table's rows on its natural key, stamped with the run id and the ingest time; the counts."""
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    counts: dict[str, int] = {}
    for table, frame in frames.items():
        if frame.empty and plan.skipped:  # the tables exist (their ids matched): nothing to merge
            stats = {"inserted": 0}
        else:
            df = _to_spark(spark, frame, table, run_id, now)
            stats = merge_rows(spark, cfg, table, df,
                               fill_nulls=("uri", "tags", "descriptions", "width", "height", "tags_confidence")
                               if table == "images" else ())
        counts.update(table_counts(table, frame, stats["inserted"]))
    return counts


def accounting_counts(plan: IngestPlan, counts: dict[str, int]) -> dict[str, int]:
    """Every record accounted for (module docstring): read per table, duplicates, scene descriptions, the per-source
    ``read = kept + quarantined + duplicates`` and the sources read or skipped. ``counts``: the tables' counts."""
    result, per_source = plan.result, plan.per_source
    n_dup = {kind: sum(1 for d in result.duplicates if (key in d)) for kind, key in
             (("stylized_captions", "scene_id"), ("factual_captions", "caption_id"))}
    out = {"stylized_captions.duplicates": n_dup["stylized_captions"],
           "stylized_captions.read": counts["stylized_captions.kept"] + n_dup["stylized_captions"],
           "factual_captions.duplicates": n_dup["factual_captions"],
           "factual_captions.excluded_stylized_image": len(result.descriptions),
           "factual_captions.read": (counts["factual_captions.kept"] + n_dup["factual_captions"]
                                     + len(result.descriptions)),
           "images.descriptions": len(result.descriptions),
           "images.with_descriptions": len({d["image_id"] for d in result.descriptions}),
           "quarantine.read": counts["quarantine.kept"]}
    for part in ACCOUNTING:
        out[f"rows.{part}"] = sum(c[part] for c in per_source.values())
    for name, c in per_source.items():
        out.update({f"source.{name}.{k}": v for k, v in c.items() if v or k in ACCOUNTING})
    out.update({"sources.read": len(plan.todo), "sources.skipped_unchanged": len(plan.skipped),
                "sources.reread_for_new_stylized_images": plan.reread})
    return out


def plan_step(ctx: JobContext) -> IngestPlan:
    return plan_ingest(ctx.spark, ctx.cfg, ctx["sources"])


def write_step(ctx: JobContext) -> None:
    plan = ctx["plan"]
    frames, kept_split = table_frames(plan, ctx.cfg.ingest.split_fractions)
    ctx.counts.update(write_tables(ctx.spark, ctx.cfg, frames, plan, ctx.run_id))
    ctx.counts["stylized_captions.split_from_table"] = kept_split
    ctx.counts.update(accounting_counts(plan, ctx.counts))


def report_step(ctx: JobContext) -> None:
    """The accounting artifacts; then the sources read are recorded as ingested (a rerun skips them)."""
    plan = ctx["plan"]
    reports.log_ingest(plan.per_source, [q["reason"] for q in plan.result.quarantine],
                       duplicate_examples(plan.result), summary_lines(plan.per_source))
    record_ingested_sources(ctx.spark, ctx.cfg, INGEST_TABLES,
                            {source_key(s): plan.fingerprints[source_key(s)] for s in plan.todo})
    ctx.summary.update({"sources": plan.per_source, "skipped_sources": [s.name or s.format for s in plan.skipped]})


INGEST_STEPS = (Step("plan", plan_step), Step("write", write_step), Step("report", report_step))


def ingest(spark: SparkSession, cfg: ErgConfig, sources: list[IngestSource] | None = None) -> dict[str, int]:
    """Ingest ``sources`` (default: ``cfg.ingest.sources``, or the generated sample when that is empty)."""
    if sources is None:
        sources = list(cfg.ingest.sources)
    if not sources:
        if not sample_exists(cfg):
            write_sample(cfg)
        sources = sample_sources(cfg)
    params = {"sources": [s.path for s in sources], "splits": cfg.ingest.splits.model_dump()}
    return run_job(spark, cfg, "ingest", INGEST_STEPS, params=params, inputs={"sources": sources})


#: the parts of every source's accounting: read = kept + quarantined + duplicates
ACCOUNTING = ("read", "kept", "quarantined", "duplicates", "unaccounted")


def summary_lines(per_source: dict[str, dict[str, int]]) -> list[str]:
    """A table of every source's read = kept + quarantined + duplicates (what ``erg ingest`` prints)."""
    return reports.summary_lines(per_source, ACCOUNTING)
