"""What each writing job left behind, and ``erg restore``: undo to any finished run.

At the end of every writing job (each stage's MLflow run and ``erg run``'s parent)
:func:`jobs.platform.state.record_state` writes onto its MLflow run the state of the schema right after it: the Delta
version of every table (tags ``erg.versions``, ``erg.written``: those whose version the job moved) and, in
``erg_state.json``, the tables' Delta ids, the watermarks and ingested-source record and the ``current`` alias of
each registered model.

A job that failed records nothing. ``erg history`` (:func:`history`) lists the runs with the tables and versions each
wrote. ``erg restore --run RUN_ID`` (:func:`restore`) brings every table back to its version after that run
(``RESTORE TABLE ... TO VERSION AS OF``, a new commit, so a restore is itself undone by restoring to a run before
it), writes back the watermarks and ingested-source record, and moves every ``current`` alias back; a table that did
not exist then is emptied (kept, with its history), a model registered later loses its ``current`` alias. It runs
under the schema's lock (:mod:`jobs.platform.lock`), so it refuses while another job is writing.
"""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

from jobs.platform.config import ErgConfig
from jobs.platform.errors import UserError
from jobs.platform.state import SCHEMA_TAG, STATE_ARTIFACT, VERSIONS_TAG, WRITTEN_TAG, schema_key


# ----------------------------------------------------------------------------------------------- history
def _client(cfg: ErgConfig):
    from mlflow import MlflowClient

    from jobs.platform.mlflow_setup import configure_mlflow

    experiment_id = configure_mlflow(cfg)  # first: the client takes the tracking URI it sets
    return MlflowClient(), experiment_id


def history(cfg: ErgConfig, last: int = 30) -> list[dict[str, Any]]:
    """The schema's last ``last`` job runs (newest first; a run's stage runs follow it), each with its job, start,
    status and the tables (and versions) it wrote; ``restorable``: whether it recorded its state."""
    client, experiment_id = _client(cfg)
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{SCHEMA_TAG}` = '{schema_key(cfg)}'",
                              order_by=["attributes.start_time DESC"], max_results=last)
    rows = []
    for run in runs:
        tags = run.data.tags
        rows.append({
            "run_id": run.info.run_id, "job": tags.get("erg.job", "?"), "parent_run_id": tags.get("mlflow.parentRunId"),
            "start_time": dt.datetime.fromtimestamp(run.info.start_time / 1000, dt.timezone.utc).strftime(
                "%Y-%m-%d %H:%M:%S"),
            "status": run.info.status, "incremental": tags.get("erg.incremental"),
            "restorable": VERSIONS_TAG in tags,
            "written": json.loads(tags[WRITTEN_TAG]) if WRITTEN_TAG in tags else None,
            "versions": json.loads(tags[VERSIONS_TAG]) if VERSIONS_TAG in tags else None})
    ids = {r["run_id"] for r in rows}
    tops = [r for r in rows if r["parent_run_id"] not in ids]
    ordered = []
    for top in tops:  # newest first; each run's stages after it, in the order they ran
        ordered.append(top)
        ordered += sorted((r for r in rows if r["parent_run_id"] == top["run_id"]), key=lambda r: r["start_time"])
    return ordered


def render_history(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'RUN ID':<32}  {'JOB':<12} {'STARTED (UTC)':<19}  {'STATUS':<9} WROTE (table=Delta version)"]
    for r in rows:
        job = ("  " if r["parent_run_id"] and any(p["run_id"] == r["parent_run_id"] for p in rows) else "") + r["job"]
        if r["job"] == "run" and r["incremental"] == "true":
            job += " --incr"
        if not r["restorable"]:
            wrote = "(no versions recorded: not restorable)"
        else:
            wrote = " ".join(f"{t}={v}" for t, v in r["written"].items()) or "-"
        lines.append(f"{r['run_id']:<32}  {job:<12} {r['start_time']:<19}  {r['status']:<9} {wrote}")
    if not rows:
        lines.append("(no runs of this schema recorded yet)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- restore
def load_state(cfg: ErgConfig, run_id: str) -> dict[str, Any]:
    """The state ``run_id`` recorded; a :class:`UserError` when the run is unknown, of another schema, or recorded
    none."""
    import mlflow

    client, _ = _client(cfg)
    try:
        run = client.get_run(run_id)
    except mlflow.exceptions.MlflowException:
        raise UserError(f"no MLflow run {run_id!r} in {cfg.mlflow.tracking_uri}",
                        "pick a run id from `erg history`") from None
    schema = run.data.tags.get(SCHEMA_TAG)
    if schema is not None and schema != schema_key(cfg):
        raise UserError(f"run {run_id} wrote schema {schema}, not this conf's schema {schema_key(cfg)}",
                        f"restore it with --set tables.schema={schema.rsplit('.', 1)[-1]}")
    if VERSIONS_TAG not in run.data.tags:
        raise UserError(f"run {run_id} ({run.data.tags.get('erg.job', '?')}, {run.info.status}) has no recorded "
                        "table versions: it did not finish, did not write, or ran before versions were recorded",
                        "pick a run with versions from `erg history`")
    return mlflow.artifacts.load_dict(f"runs:/{run_id}/{STATE_ARTIFACT}")


def restore(spark, cfg: ErgConfig, run_id: str) -> dict[str, Any]:
    """Bring the schema back to its state right after ``run_id``: every table, the watermarks, the ingested-source
    record and the ``current`` aliases. Runs under the schema's lock (refuses at once while another job holds it);
    recorded as an MLflow run of job ``restore`` (itself restorable)."""
    from jobs.platform.lock import hold

    state = load_state(cfg, run_id)
    with hold(spark, cfg, f"erg restore --run {run_id}", wait_s=0):
        return _restore(spark, cfg, run_id, state)


def _restore(spark, cfg: ErgConfig, run_id: str, state: dict[str, Any]) -> dict[str, Any]:
    import mlflow

    from jobs.platform.model_store import current_aliases, point_current
    from jobs.platform.tables import TABLES, table_name
    from jobs.platform.tracking import job_run
    from jobs.platform.watermarks import (table_id, table_version, watermarks_path, write_ingested_sources,
                                          write_watermarks)

    recorded, ids = state["tables"], state.get("table_ids", {})
    for table, version in recorded.items():  # check everything before changing anything
        now_id = table_id(spark, cfg, table) if table in TABLES else None
        if now_id is None:
            raise UserError(f"table {table_name(cfg, table)} no longer exists, so its version {version} of run "
                            f"{run_id} cannot be restored", "restore it from a backup, or restore to a later run")
        if ids.get(table) and ids[table] != now_id:
            raise UserError(f"table {table_name(cfg, table)} was dropped and made again after run {run_id} (its Delta "
                            "id changed): the versions of then are gone", "restore to a run after it was made again")
    with job_run(cfg, "restore", params={"restore.run_id": run_id}) as run:
        tables: dict[str, dict[str, Any]] = {}
        for table in TABLES:
            name = table_name(cfg, table)
            if not spark.catalog.tableExists(name):
                continue
            current = table_version(spark, cfg, table)
            if table not in recorded:  # made after that run: emptied, kept with its history
                spark.sql(f"DELETE FROM {name}").collect()
                tables[table] = {"action": "emptied (did not exist after that run)", "from": current,
                                 "to": table_version(spark, cfg, table)}
                continue
            target = int(recorded[table])
            if current == target:
                tables[table] = {"action": "unchanged", "from": current, "to": current, "as_of": target}
                continue
            try:
                spark.sql(f"RESTORE TABLE {name} TO VERSION AS OF {target}").collect()
            except Exception as exc:  # noqa: BLE001 - vacuumed files or an expired log come as various classes
                raise UserError(f"could not restore {name} to version {target}: {str(exc).splitlines()[0][:300]}",
                                "its files of then were probably vacuumed (VACUUM, delta.deletedFileRetention"
                                "Duration); restore to a later run") from None
            tables[table] = {"action": "restored", "from": current, "to": table_version(spark, cfg, table),
                             "as_of": target}

        # watermarks: a consumer that had read a table's version of then has read its restored version now; one
        # that had read an older version would meet, in the table's change feed, rows that the restore removed
        # again: it starts over (its next run does the full work once)
        marks, dropped = {}, []
        for consumer, seen in (state.get("watermarks") or {}).items():
            if all(int(v) == int(recorded.get(t, -1)) for t, v in seen.items()):
                marks[consumer] = {t: tables[t]["to"] for t in seen}
            else:
                dropped.append(consumer)
        write_watermarks(cfg, marks)
        write_ingested_sources(cfg, state.get("ingested_sources"))

        models: dict[str, dict[str, str | None]] = {}
        now = current_aliases(cfg)
        for name in sorted(set(now) | set(state.get("models") or {})):
            target = (state.get("models") or {}).get(name)
            if now.get(name) != target:
                point_current(cfg, name, target)
            models[name] = {"from": now.get(name), "to": target}
        result = {"restored_to": run_id, "tables": tables, "watermarks": marks,
                  "watermarks_reset": dropped, "models": models, "watermarks_file": str(watermarks_path(cfg))}
        mlflow.log_dict(result, "restore.json")
        mlflow.set_tag("erg.restored_to", run_id)
        result["run_id"] = run.info.run_id
    return result
