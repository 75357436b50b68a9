"""jobs.platform.runner's steps without Spark or MLflow: order, outputs by name, timing, skipped steps, cleanups, and
the ingest accounting the runner's steps compose (pure pandas)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from jobs.platform.runner import JobContext, Step, default_result, run_steps


def _ctx(**kwargs) -> JobContext:
    return JobContext(spark=None, cfg=None, run=SimpleNamespace(info=SimpleNamespace(run_id="r1")), **kwargs)


def test_steps_run_in_order_and_see_the_outputs_of_earlier_steps():
    seen = []

    def plan(ctx):
        seen.append("plan")
        ctx.counts["items"] = 3
        return [1, 2, 3]

    def apply(ctx):
        seen.append("apply")
        return [2 * x for x in ctx["plan"]]

    ctx = run_steps(_ctx(out={"given": 1}), [Step("plan", plan), Step("apply", apply)])
    assert seen == ["plan", "apply"]
    assert ctx["apply"] == [2, 4, 6] and ctx["given"] == 1
    assert default_result(ctx) == {"items": 3, "run_id": "r1"}


def test_only_timed_steps_add_seconds_and_a_skipped_step_neither_runs_nor_times():
    ctx = run_steps(_ctx(counts={"encoded": 0}), [
        Step("plan", lambda ctx: None, timed=True),
        Step("encode", lambda ctx: pytest.fail("skipped step ran"), timed=True, when=lambda ctx: ctx.counts["encoded"]),
        Step("report", lambda ctx: "done"),
    ])
    assert "seconds.plan" in ctx.counts and ctx.counts["seconds.plan"] >= 0
    assert "seconds.encode" not in ctx.counts and "seconds.report" not in ctx.counts
    assert "encode" not in ctx.out and ctx["report"] == "done"


def test_cleanups_run_last_first_also_when_a_step_fails():
    released = []

    def hold(ctx):
        ctx.on_exit(lambda: released.append("first"))
        ctx.on_exit(lambda: released.append("second"))

    def fail(ctx):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_steps(_ctx(), [Step("hold", hold), Step("fail", fail)])
    assert released == ["second", "first"]


def test_summary_is_returned_but_metrics_are_not():
    ctx = _ctx()
    ctx.counts["a"] = 1
    ctx.metrics["logged_only"] = 2.0
    ctx.summary["version"] = "v"
    assert default_result(ctx) == {"a": 1, "version": "v", "run_id": "r1"}


def test_ingest_table_counts_split_the_stylized_rows_and_images():
    import pandas as pd

    from jobs.ingest import table_counts

    frame = pd.DataFrame({"image_id": ["a", "a", "b"], "split": ["train", "train", "test"]})
    counts = table_counts("stylized_captions", frame, inserted=2)
    assert counts == {"stylized_captions.kept": 3, "stylized_captions.inserted": 2,
                      "stylized_captions.key_in_table": 1, "stylized_captions.split.train": 2,
                      "stylized_captions.split.test": 1, "stylized_captions.images.train": 1,
                      "stylized_captions.images.test": 1}
    assert table_counts("quarantine", frame, inserted=3) == {"quarantine.kept": 3, "quarantine.inserted": 3}


def test_embed_planned_counts_cover_every_kind_and_the_items_to_encode():
    from jobs.embed import planned_counts

    class Row(dict):
        """A Spark Row's access: by attribute and by key."""
        __getattr__ = dict.__getitem__

    def row(kind: str, has_input: bool, done: bool, n: int) -> Row:
        return Row(item_kind=kind, has_input=has_input, done=done, count=n)

    planned = [row("scene", True, False, 4), row("scene", True, True, 2), row("image", False, False, 3),
               row("factual", True, False, 5)]
    counts = planned_counts(planned)
    assert counts["items.scene"] == 6 and counts["already_embedded.scene"] == 2 and counts["to_embed.scene"] == 4
    assert counts["skipped.image.no_input"] == 3 and counts["to_embed.image"] == 0
    assert counts["encoded"] == 9 and counts["embeddings.inserted"] == 0
    assert counts["skipped.factual.failed"] == 0 and counts["embedded.factual"] == 0
