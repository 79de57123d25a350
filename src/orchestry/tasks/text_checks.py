"""Content checks the text tasks share: real sentences, content words, repetition and copied text.

The checks are deterministic and need no model: a *sentence* is real prose when it has enough words, at least
one English function word (keyword salad and lists of names have none) and is not mostly a repeat of itself;
*support* of a claim by a passage is the share of the claim's content words (stemmed) found in the passage;
*copying* is measured with word n-grams shared with a source (the prompt, the passages).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Sequence

_WORD = re.compile(r"[A-Za-z0-9]+(?:['’][A-Za-z]+)?")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"”’')\]]*\s+|\n\s*\n|\n(?=\s*[-*•]|\s*\d+[.)]\s)")

# closed-class English words: every real sentence has one; keyword salad and bare name lists have none
_FUNCTION_WORDS = (
    "a an the and or but if then than that this these those there here of to in on at by for from with "
    "without into onto over under about after before while when where which who whom whose what how why "
    "is are was were be been being am has have had do does did will would can could should may might must "
    "not no as so too very all any each every some such only also just its it's"
)
FUNCTION_WORDS = frozenset(_FUNCTION_WORDS.split())
_PRONOUNS = (
    "i me my mine myself we us our ours ourselves you your yours he she they him her them his hers their "
    "theirs himself herself themselves it itself"
)
PRONOUNS = frozenset(_PRONOUNS.split())
STOPWORDS = FUNCTION_WORDS | PRONOUNS | frozenset(("it's", "one", "two", "get", "gets", "got"))


def words(text: str) -> list[str]:
    """The words of ``text`` (letters/digits, an inner apostrophe kept), lower-case."""
    return [w.lower() for w in _WORD.findall(text or "")]


def stem(word: str) -> str:
    """A crude stem: lower-case, a plural ``s`` cut, the first 5 letters (``serializes`` and ``serialize``
    -> ``seria``, ``objects`` -> ``objec``, ``keys`` -> ``key``)."""
    w = word.lower()
    if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
        w = w[:-1]
    return w[:5]


def content_stems(text: str) -> set[str]:
    """Stems of the content words of ``text``: words of 3+ characters that are not function words/pronouns."""
    return {stem(w) for w in words(text) if len(w) >= 3 and w not in STOPWORDS and not w.isdigit()}


def sentences(text: str) -> list[str]:
    """``text`` split into sentences (end punctuation, blank lines, list items), stripped, non-empty."""
    return [s.strip() for s in _SENTENCE_END.split(text or "") if s and s.strip()]


def distinct_n(ws: Sequence[str], n: int = 2) -> float:
    """Distinct word n-grams / n-grams (1.0 for fewer than ``n`` words): low for repetitive text."""
    grams = [tuple(ws[i : i + n]) for i in range(len(ws) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def compression_ratio(text: str) -> float:
    """zlib-compressed size / size of ``text`` (UTF-8); repetitive text compresses far below prose (~0.5+ for
    a paragraph). 1.0 for an empty text."""
    raw = (text or "").encode("utf-8")
    return len(zlib.compress(raw, 9)) / len(raw) if raw else 1.0


def is_real_sentence(sentence: str, min_words: int = 4, avoid: Iterable[str] = ()) -> bool:
    """``sentence`` reads as prose: at least ``min_words`` words, a function word or pronoun, distinct bigrams >= 0.7, and
    at least ``min_words - 1`` words that are not in ``avoid`` (e.g. the required words of a story)."""
    ws = words(sentence)
    if len(ws) < min_words or not any(w in FUNCTION_WORDS or w in PRONOUNS for w in ws):
        return False
    avoid = {a.lower() for a in avoid}
    if sum(1 for w in ws if w.rstrip("s") not in avoid and w not in avoid) < min_words - 1:
        return False
    return distinct_n(ws, 2) >= 0.7


def ngrams(ws: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(ws[i : i + n]) for i in range(len(ws) - n + 1)}


def copied_share(text: str, sources: Iterable[str], n: int = 5) -> float:
    """Share of the words of ``text`` covered by a word n-gram that occurs verbatim in one of ``sources``
    (0 for a text shorter than ``n`` words)."""
    ws = words(text)
    if len(ws) < n:
        return 0.0
    known: set[tuple[str, ...]] = set()
    for s in sources:
        known |= ngrams(words(s), n)
    covered = [False] * len(ws)
    for i in range(len(ws) - n + 1):
        if tuple(ws[i : i + n]) in known:
            for j in range(i, i + n):
                covered[j] = True
    return sum(covered) / len(ws)


def support(claim: str, passage: str) -> float:
    """Share of the claim's content stems found in the passage's (0 for a claim without content words)."""
    c = content_stems(claim)
    return len(c & content_stems(passage)) / len(c) if c else 0.0
