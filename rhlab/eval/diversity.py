"""Diversity and degeneracy of a set of samples: the text-collapse side of reward hacking."""

from __future__ import annotations

import itertools
import re

_WORD = re.compile(r"[a-z']+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def distinct_n(texts: list[str], n: int) -> float:
    """Unique n-grams / total n-grams over all samples (0 when there are none)."""
    grams = [tuple(w[i:i + n]) for w in map(words, texts) for i in range(len(w) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def mean_pairwise_jaccard(texts: list[str]) -> float:
    """Mean Jaccard similarity of the word sets of every pair (1 = all identical)."""
    sets = [set(words(t)) for t in texts]
    pairs = list(itertools.combinations(sets, 2))
    if not pairs:
        return 0.0
    return sum(len(a & b) / len(a | b) if a | b else 1.0 for a, b in pairs) / len(pairs)


def repetition_rate(text: str) -> float:
    """Fraction of a sample's words that repeat an earlier word bigram: 0 fresh, ->1 looping."""
    w = words(text)
    grams = list(zip(w, w[1:]))
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def diversity(texts: list[str], degenerate_jaccard: float = 0.6, degenerate_distinct2: float = 0.2) -> dict:
    assert texts, "diversity of an empty sample set"
    d2 = distinct_n(texts, 2)
    jac = mean_pairwise_jaccard(texts)
    return {
        "unique_frac": len(set(texts)) / len(texts),
        "jaccard": jac,
        "distinct_1": distinct_n(texts, 1),
        "distinct_2": d2,
        "repetition": sum(map(repetition_rate, texts)) / len(texts),
        # degenerate: samples look alike or are made of few distinct bigrams
        "degenerate": float(jac > degenerate_jaccard or d2 < degenerate_distinct2),
    }
