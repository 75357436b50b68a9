"""Word-level quality of generated captions: well-formedness, content kept, phrase taken up.

Used by the well-formedness filter of the Generate step (beyond the paper: a generator can write fluent-looking
nonsense that the paper's three filters pass) and by ``benchmarks/generator_quality.py``:

- a *non-word* is a generated word outside the known vocabulary (the words of the corpora the generator was trained
  on and of its input); punctuation tokens are not words and never count;
- a *repeated trigram* is a word trigram that occurs twice in one caption ("on a pan on a pan");
- *content words* are words that are not stopwords or punctuation; ``content_recall`` is the share of the factual
  caption's content words (with multiplicity) that the generated caption keeps, ``phrase_uptake`` the share of the
  retrieved style phrase's content words it uses.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from models.text import caption_words, is_punctuation

#: Function words that carry no content (articles, pronouns, auxiliaries, prepositions, conjunctions).
STOPWORDS = frozenset("""
a an the this that these those there here it its it's he she they them his her their him we us our i me my you your
is are was were be been being am has have had do does did will would can could shall should may might must
of in on at by for with from to into onto over under up down out off about above below near through while as
and or but so than then too very not no nor just also some any each both all most more other such own same
""".split())


def content_words(text: str) -> list[str]:
    """The caption's words that are neither stopwords nor punctuation, in order."""
    return [w for w in caption_words(text) if w not in STOPWORDS and not is_punctuation(w)]


def _kept_share(source: Sequence[str], generated: Sequence[str]) -> float | None:
    if not source:
        return None
    have = Counter(generated)
    kept = 0
    for word, count in Counter(source).items():
        kept += min(count, have[word])
    return kept / len(source)


def content_recall(factual_caption: str, generated: str) -> float | None:
    """Share of the factual caption's content words kept in the generated caption (None if it has none)."""
    return _kept_share(content_words(factual_caption), content_words(generated))


def phrase_uptake(style_phrase: str, generated: str) -> float | None:
    """Share of the style phrase's content words used in the generated caption (None if it has none)."""
    return _kept_share(content_words(style_phrase), content_words(generated))


def nonwords(text: str, vocabulary: set[str] | frozenset[str], also_known: Iterable[str] = ()) -> list[str]:
    """Words of ``text`` in neither ``vocabulary`` nor ``also_known`` (e.g. the input's own words)."""
    extra = set(also_known)
    return [w for w in caption_words(text) if not is_punctuation(w) and w not in vocabulary and w not in extra]


def repeated_trigram(text: str) -> bool:
    """True when some word trigram occurs more than once in the caption."""
    words = caption_words(text)
    grams = list(zip(words, words[1:], words[2:]))
    return len(grams) != len(set(grams))


def well_formedness(text: str, vocabulary: set[str] | frozenset[str], also_known: Iterable[str] = ()) -> str | None:
    """None if the caption is well formed, else the reason: ``empty``, ``nonword:<word>`` or ``repeated_trigram``."""
    if not caption_words(text):
        return "empty"
    bad = nonwords(text, vocabulary, also_known)
    if bad:
        return f"nonword:{bad[0]}"
    if repeated_trigram(text):
        return "repeated_trigram"
    return None
