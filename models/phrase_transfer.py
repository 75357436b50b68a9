"""Which words of a retrieved style phrase the generator is asked to place into a factual caption.

The extracted phrase e^s of a stylized caption is every word that the style head attends to most (a proportion eps
of the caption), so besides its style words ("nice", "dirty", "in love") it holds articles, verbs and nouns of its
own scene ("a a nice", "toilet a tiny", "front building walking"). Forced into another scene's caption, those make
"a a nice man" or "the girl mirror". The *transfer phrase* keeps, from each contiguous span of phrase words,

- the style words: not a stopword or punctuation, not already in the factual caption, and put in the phrase rather
  than in the content in at least ``min_propensity`` of their occurrences in the train split (the word's
  *phrase propensity*, learnt from the extractor's own output: "beautiful" ~1, "building" ~0);
- the function words lying between two kept words of the same span ("happily in love", "pretending to be a horse").

Where a style lives in a trailing clause (FlickrStyle's humor and romantic: "a dog walks on the sand, searching for
bones", "... to amuse her dad"), those style words alone ("searching", "amuse") do not carry it into another
caption. With ``clause_words`` n > 0 the transfer phrase is then the *clause* of the first kept style word: from the
function words just before it ("in search of", "to amuse") to the clause's end (punctuation or the caption's end),
when that is at most n words; otherwise, the words above.

The generator is trained on the same split of each train caption (transfer phrase, the rest as content), so what
it learns and what it is asked agree. The stored ``style_phrase`` stays the paper's e^s.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from models.caption_quality import STOPWORDS
from models.text import caption_words, is_punctuation

FORMAT = "erg-phrase-propensity/1"


def phrase_propensity(tokens: Iterable[Sequence[str]], masks: Iterable[Sequence[bool]],
                      prior: float = 1.0) -> dict[str, float]:
    """Per word, the smoothed share of its occurrences (in these captions) that the extractor put in the phrase:
    ``(in_phrase + prior / 2) / (occurrences + prior)``."""
    in_phrase, total = Counter(), Counter()
    for words, mask in zip(tokens, masks):
        if len(words) != len(mask):
            raise ValueError(f"tokens and phrase mask differ in length: {len(words)} vs {len(mask)}")
        for word, masked in zip(words, mask):
            total[word] += 1
            in_phrase[word] += bool(masked)
    return {w: (in_phrase[w] + prior / 2) / (n + prior) for w, n in total.items()}


def _is_style_word(word: str, factual: set[str], propensity: Mapping[str, float], min_propensity: float) -> bool:
    return (word not in STOPWORDS and not is_punctuation(word) and word not in factual
            and propensity.get(word, 0.0) >= min_propensity)


def clause_of(tokens: Sequence[str], first: int, max_words: int) -> tuple[int, int] | None:
    """``[start, end)``: the clause of ``tokens[first]``, from the function words right before it to the next
    punctuation or the end; None when it is longer than ``max_words`` or holds no word before ``first`` is left
    (the clause would be the whole caption)."""
    start = first
    while start > 0 and tokens[start - 1] in STOPWORDS and not is_punctuation(tokens[start - 1]):
        start -= 1
    end = first
    while end < len(tokens) and not is_punctuation(tokens[end]):
        end += 1
    if start == 0 or end - start > max_words:
        return None
    return start, end


def transfer_mask(tokens: Sequence[str], mask: Sequence[bool], propensity: Mapping[str, float],
                  min_propensity: float, factual_caption: str = "", clause_words: int = 0) -> list[bool]:
    """Which ``tokens`` (a stylized caption; ``mask``: its phrase words) go into the transfer phrase; with
    ``clause_words`` > 0, the clause of the first style word where it has at most that many words."""
    if len(tokens) != len(mask):
        raise ValueError(f"tokens and phrase mask differ in length: {len(tokens)} vs {len(mask)}")
    factual = set(caption_words(factual_caption))
    out = [False] * len(tokens)
    i = 0
    while i < len(tokens):
        if not mask[i]:
            i += 1
            continue
        j = i
        while j < len(tokens) and mask[j]:
            j += 1  # [i, j) is one span of phrase words
        kept = [k for k in range(i, j) if _is_style_word(tokens[k], factual, propensity, min_propensity)]
        if kept:
            for k in range(kept[0], kept[-1] + 1):
                out[k] = k in kept or (tokens[k] in STOPWORDS and not is_punctuation(tokens[k]))
        i = j
    return with_clause(tokens, out, clause_words)[0]


def with_clause(tokens: Sequence[str], keep: list[bool], clause_words: int) -> tuple[list[bool], bool]:
    """(``keep`` replaced by its first style word's clause where ``clause_words`` > 0 and one fits, whether it was)."""
    clause = clause_mask(tokens, keep, clause_words) if clause_words > 0 else None
    return (clause, True) if clause is not None else (keep, False)


def clause_mask(tokens: Sequence[str], keep: Sequence[bool], max_words: int) -> list[bool] | None:
    """The clause (:func:`clause_of`) of the first style word that ``keep`` (a :func:`transfer_mask`) holds, as a
    mask; None where there is no such word or no clause of at most ``max_words`` words."""
    first = next((k for k, kept in enumerate(keep) if kept and tokens[k] not in STOPWORDS), None)
    span = clause_of(tokens, first, max_words) if first is not None else None
    return None if span is None else [span[0] <= k < span[1] for k in range(len(tokens))]


def transfer_phrase(tokens: Sequence[str], mask: Sequence[bool], propensity: Mapping[str, float],
                    min_propensity: float, factual_caption: str = "", clause_words: int = 0) -> str:
    """The transfer phrase for placing this stylized caption's style into ``factual_caption`` ("" if none)."""
    return transfer_split(tokens, mask, propensity, min_propensity, factual_caption, clause_words)[0]


def transfer_split(tokens: Sequence[str], mask: Sequence[bool], propensity: Mapping[str, float],
                   min_propensity: float, factual_caption: str = "", clause_words: int = 0) -> tuple[str, bool]:
    """(transfer phrase, whether it is a whole clause): the generator writes a clause after the content."""
    chosen, is_clause = with_clause(tokens, transfer_mask(tokens, mask, propensity, min_propensity, factual_caption),
                                    clause_words)
    return " ".join(t for t, k in zip(tokens, chosen) if k), is_clause


def save_propensity(propensity: Mapping[str, float], min_propensity: float, path: str | Path,
                    clause_words: Mapping[str, int] | None = None) -> str:
    """The propensities with the rule's settings (``clause_words``: per style, see :func:`transfer_mask`), so that
    generation applies the rule the generator was trained with."""
    Path(path).write_text(json.dumps({"format": FORMAT, "min_propensity": min_propensity,
                                      "clause_words": dict(clause_words or {}),
                                      "propensity": dict(sorted(propensity.items()))}))
    return str(path)


def load_propensity(path: str | Path) -> tuple[dict[str, float], float, dict[str, int]]:
    """(propensity, min_propensity, clause_words per style) as written by :func:`save_propensity`."""
    data = json.loads(Path(path).read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a phrase propensity file (format {data.get('format')!r}, expected {FORMAT!r})")
    return data["propensity"], float(data["min_propensity"]), {s: int(n) for s, n in data.get("clause_words", {}).items()}
