"""Caption text: the word segmentation every stage shares.

A caption's words w_1..w_T (paper Eq. 1) are its lower-cased whitespace tokens after punctuation is split
off, so that a style phrase plus its content, put back in word order, reassemble the normalised caption.
"""
from __future__ import annotations

import re
import unicodedata

_PUNCT = re.compile(r"([.,!?;:\"()\[\]])")
_SPACE = re.compile(r"\s+")


def normalize_caption(text: str) -> str:
    """Lower-case, NFKC, punctuation split into its own tokens, single spaces, no trailing period."""
    text = unicodedata.normalize("NFKC", text or "").lower().replace("\u2019", "'")
    text = _PUNCT.sub(r" \1 ", text)
    text = _SPACE.sub(" ", text).strip()
    while text.endswith(" .") or text == ".":
        text = text[:-2].rstrip() if text != "." else ""
    return text


def caption_words(text: str) -> list[str]:
    """The words of a caption, as scored by the extractor and fed to the generator."""
    norm = normalize_caption(text)
    return norm.split(" ") if norm else []


def is_punctuation(word: str) -> bool:
    """True for a token without any letter or digit (",", "!", "...")."""
    return not any(char.isalnum() for char in word)
