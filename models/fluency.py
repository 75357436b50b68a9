"""Fluency: is a caption well-formed English? A discriminator for generate's fluency filter (no Spark).

A merge generator places a style phrase into a factual caption, and some placements read as broken English that
the style, perplexity, content and well-formedness filters all pass ("a man is riding on the back end of his
surfboard expert", "a woman wearing a helmet is riding a horse trying to rides a horse"). The discriminator is a
BERT-family classifier (MiniLM by default) fine-tuned on real captions (fluent) against corruptions of real captions
made by the operations that break generated ones (broken):

- ``clause_mid``: a style phrase of another caption grafted inside the caption (not at its end);
- ``word_inserted``: a style word of another caption put at a random place;
- ``word_dropped`` / ``word_doubled``: a word left out / written twice;
- ``verb_form``: a verb in the wrong form ("trying to rides", "is ride");
- ``words_swapped``: two neighbouring words swapped.

A corruption that gives back a real caption's word sequence is not used. :func:`choose_threshold` sets the decision
threshold from real held-out captions (val split): the share of them that must pass.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np

FLUENT, BROKEN = "fluent", "broken"
CORRUPTIONS = ("clause_mid", "word_inserted", "word_dropped", "word_doubled", "verb_form", "words_swapped")
_ARTICLES = {"a", "an", "the"}


def _verb_form(words: list[str], rng: random.Random) -> list[str] | None:
    """One verb-like word put in a wrong form: -ing -> base or -s; -s after "to" / a modal; base after "is"."""
    spots = []
    for i, w in enumerate(words):
        if len(w) > 5 and w.endswith("ing"):
            spots.append((i, [w[:-3], w[:-3] + "s"]))
        elif i and words[i - 1] in ("to", "can", "will", "would") and w.isalpha() and len(w) > 2:
            spots.append((i, [w + "s", w + "ing"]))
        elif i and words[i - 1] in ("is", "are") and len(w) > 5 and w.endswith("ing"):
            spots.append((i, [w[:-3]]))
    if not spots:
        return None
    i, forms = rng.choice(spots)
    out = list(words)
    out[i] = rng.choice(forms)
    return out


def corrupt(words: Sequence[str], kind: str, rng: random.Random, phrases: Sequence[Sequence[str]]
            ) -> list[str] | None:
    """``words`` broken by ``kind`` (one of :data:`CORRUPTIONS`); None where the caption gives it no place (too
    short, no verb form) or the result equals the input. ``phrases``: style phrases of other captions to graft."""
    words = list(words)
    n = len(words)
    if n < 3:
        return None
    out: list[str] | None
    if kind == "clause_mid":
        phrase = [w for w in rng.choice(phrases)] if phrases else []
        if not phrase:
            return None
        at = rng.randrange(1, n - 1)
        out = words[:at] + phrase + words[at:]
    elif kind == "word_inserted":
        pool = [w for p in phrases for w in p if w.isalpha() and w not in _ARTICLES]
        if not pool:
            return None
        at = rng.randrange(1, n + 1)
        out = words[:at] + [rng.choice(pool)] + words[at:]
    elif kind == "word_dropped":
        at = rng.randrange(n)
        out = words[:at] + words[at + 1:]
    elif kind == "word_doubled":
        at = rng.randrange(n)
        out = words[: at + 1] + [words[at]] + words[at + 1:]
    elif kind == "verb_form":
        out = _verb_form(words, rng)
    elif kind == "words_swapped":
        at = rng.randrange(n - 1)
        if words[at] == words[at + 1]:
            return None
        out = words[:at] + [words[at + 1], words[at]] + words[at + 2:]
    else:
        raise ValueError(f"corruption kind must be one of {CORRUPTIONS}, got {kind!r}")
    return out if out is not None and out != words else None


def fluency_examples(captions: Sequence[str], phrases: Sequence[str], *, seed: int, max_examples: int | None
                     ) -> tuple[list[str], list[str], dict[str, int]]:
    """Training texts and labels: each real caption (fluent) and one corruption of another real caption (broken),
    the corruption kinds taken in turn; returns (texts, labels, corruptions per kind). Corruptions that equal a real
    caption (lower-cased words) are skipped."""
    rng = random.Random(seed)
    real = [c.split() for c in captions if isinstance(c, str) and len(c.split()) >= 3]
    rng.shuffle(real)
    if max_examples is not None:
        real = real[: max(1, max_examples // 2)]
    graft = [p.split() for p in phrases if isinstance(p, str) and p.split()]
    known = {" ".join(w.lower() for w in c) for c in real}
    texts, labels, made = [], [], {k: 0 for k in CORRUPTIONS}
    order = list(CORRUPTIONS)
    for i, words in enumerate(real):
        texts.append(" ".join(words))
        labels.append(FLUENT)
        source = real[(i * 7919 + 1) % len(real)]
        for attempt in range(len(order)):
            kind = order[(i + attempt) % len(order)]
            broken = corrupt(source, kind, rng, graft)
            if broken is not None and " ".join(w.lower() for w in broken) not in known:
                texts.append(" ".join(broken))
                labels.append(BROKEN)
                made[kind] += 1
                break
    return texts, labels, made


def train_fluency_classifier(captions: Sequence[str], phrases: Sequence[str], *, name_or_path: str,
                             max_length: int, epochs: int, batch_size: int, lr: float, seed: int, device: str,
                             max_examples: int | None) -> tuple[Any, dict[str, Any]]:
    """A fluent-vs-broken classifier fine-tuned from ``name_or_path`` on :func:`fluency_examples`; returns the
    classifier (a :class:`models.style_classifier.StyleClassifier` over labels fluent / broken) and what it
    trained on."""
    from models.style_classifier import fine_tune, load_style_classifier

    texts, labels, made = fluency_examples(captions, phrases, seed=seed, max_examples=max_examples)
    clf = load_style_classifier(name_or_path, labels=[FLUENT, BROKEN], device=device, max_length=max_length,
                                with_factual=False)
    stats = fine_tune(clf, texts, labels, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed)
    return clf, {"examples": len(texts), "fluent": labels.count(FLUENT), "broken": labels.count(BROKEN),
                 "corruptions": made, **stats}


def fluency_probability(clf, texts: Sequence[str], batch_size: int) -> np.ndarray:
    """p(fluent) of each text."""
    if not len(texts):
        return np.zeros(0)
    proba = clf.predict_proba([t if t.strip() else "<empty>" for t in texts], batch_size=batch_size)
    return proba[:, clf.label_index(FLUENT)]


def choose_threshold(real_probabilities: Sequence[float], real_pass: float) -> float:
    """The highest threshold t such that at least ``real_pass`` of real held-out captions have p(fluent) >= t."""
    values = np.sort(np.asarray(real_probabilities, dtype=float))
    if not len(values):
        raise ValueError("no real captions to set the fluency threshold on")
    index = int(np.floor((1.0 - real_pass) * len(values)))
    return float(values[min(index, len(values) - 1)])
