"""Caption metrics of the paper's Table 2: BLEU-1, BLEU-3, METEOR and CIDEr through pycocoevalcap 1.2 (BLEU-2 and
BLEU-4 on request, as the COCO caption benchmark reports them).

Both sides go through the COCO evaluation's PTBTokenizer (Stanford CoreNLP, Java) first, as the COCO caption
server does; METEOR 1.5 runs as a Java subprocess, which :func:`corpus_scores` and :class:`CaptionScorer` always
close.
CIDEr is pycocoevalcap's CIDEr-D (document frequencies from the references of this corpus, so it needs several
images to mean anything: with one image every n-gram has idf 0).
"""
from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.meteor.meteor import Meteor
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

CAPTION_METRICS = ("BLEU-1", "BLEU-3", "METEOR", "CIDEr")
#: every metric a :class:`CaptionScorer` can compute (the default is :data:`CAPTION_METRICS`)
ALL_METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "CIDEr")
BLEU_METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4")


def _one_line(text: str) -> str:
    """Collapse every whitespace (``\\r``, ``\\u2028`` included) so each caption is one line for the Java tools."""
    return " ".join(text.split())


def _check_inputs(references: Mapping[Hashable, Sequence[str]], hypotheses: Mapping[Hashable, str]) -> None:
    if not hypotheses:
        raise ValueError("no hypotheses to score: give {id: generated caption} for at least one id")
    missing = [k for k in hypotheses if k not in references]
    extra = [k for k in references if k not in hypotheses]
    if missing or extra:
        raise ValueError(f"references and hypotheses must have the same ids: {len(missing)} hypothesis ids have no "
                         f"references (e.g. {missing[:5]}), {len(extra)} reference ids have no hypothesis "
                         f"(e.g. {extra[:5]})")
    for key, hyp in hypotheses.items():
        if not isinstance(hyp, str):
            raise ValueError(f"hypothesis of id {key!r} must be one caption string, got {type(hyp).__name__}")
    for key, refs in references.items():
        if isinstance(refs, str) or not all(isinstance(r, str) for r in refs):
            raise ValueError(f"references of id {key!r} must be a list of caption strings, got {refs!r}")
        if not any(r.strip() for r in refs):
            raise ValueError(f"id {key!r} has no non-empty reference caption")


class CaptionScorer:
    """Scores several corpora with one METEOR process (its start-up, loading paraphrase tables, takes seconds).

    Use as a context manager, or call :meth:`close`; the Java process is also closed if a METEOR call fails.
    """

    def __init__(self, metrics: Sequence[str] = CAPTION_METRICS) -> None:
        unknown = [m for m in metrics if m not in ALL_METRICS]
        if unknown or not metrics:
            raise ValueError(f"metrics must be a non-empty subset of {list(ALL_METRICS)}, got {list(metrics)}")
        self.metrics = tuple(metrics)
        self._meteor: Meteor | None = None

    def __enter__(self) -> CaptionScorer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the METEOR Java process, if one runs."""
        if self._meteor is None:
            return
        meteor, self._meteor = self._meteor, None
        with meteor.lock:
            process = meteor.meteor_p
            for stream in (process.stdin, process.stdout, process.stderr):
                stream.close()
            process.kill()
            process.wait()

    def _meteor_score(self, gts: dict[int, list[str]], res: dict[int, list[str]]) -> float:
        if self._meteor is None:
            self._meteor = Meteor()
        try:
            return float(self._meteor.compute_score(gts, res)[0])
        except BaseException:
            self.close()
            raise

    def score(self, references: Mapping[Hashable, Sequence[str]],
              hypotheses: Mapping[Hashable, str]) -> dict[str, float]:
        """Corpus-level scores of ``hypotheses`` ({id: caption}) against ``references`` ({id: [captions]}).

        Returns the scorer's metrics (``BLEU-n``, ``METEOR`` in [0, 1], ``CIDEr`` from 0 to 10). An
        empty hypothesis string is a valid (zero-scoring) caption; an empty mapping, different ids or an id
        without a non-empty reference is a ValueError. Empty reference strings beside real ones are dropped.
        """
        _check_inputs(references, hypotheses)
        keys = list(hypotheses)
        kept_refs = [[_one_line(r) for r in references[k] if r.strip()] for k in keys]
        # hypotheses first: a trailing empty line may not come back from the tokenizer; references are never empty
        tokenized = PTBTokenizer().tokenize({
            **{("hyp", i): [{"caption": _one_line(hypotheses[k])}] for i, k in enumerate(keys)},
            **{("ref", i): [{"caption": r} for r in refs] for i, refs in enumerate(kept_refs)},
        })
        gts = {i: tokenized.get(("ref", i), []) for i in range(len(keys))}
        res = {i: tokenized.get(("hyp", i), []) for i in range(len(keys))}
        if any(len(res[i]) != 1 or len(gts[i]) != len(refs) for i, refs in enumerate(kept_refs)):
            raise RuntimeError("PTBTokenizer returned a different number of captions than it was given")
        scores: dict[str, float] = {}
        if any(m in self.metrics for m in BLEU_METRICS):
            bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
            scores.update({name: float(value) for name, value in zip(BLEU_METRICS, bleu)})
        if "METEOR" in self.metrics:
            scores["METEOR"] = self._meteor_score(gts, res)
        if "CIDEr" in self.metrics:
            scores["CIDEr"] = float(Cider().compute_score(gts, res)[0])
        return {m: scores[m] for m in self.metrics}


def corpus_scores(references: Mapping[Hashable, Sequence[str]], hypotheses: Mapping[Hashable, str],
                  metrics: Sequence[str] = CAPTION_METRICS) -> dict[str, float]:
    """One corpus scored with ``metrics`` (default BLEU-1, BLEU-3, METEOR, CIDEr); see :meth:`CaptionScorer.score`.

    To score several corpora (one per style and run), a :class:`CaptionScorer` reuses one METEOR process.
    """
    with CaptionScorer(metrics) as scorer:
        return scorer.score(references, hypotheses)
