"""Query features and query types, the context of the contextual policies.

:func:`query_features` describes a query with a few cheap numbers (its length,
whether it holds digits or codes, a quoted phrase, a question word), and
:func:`query_type` turns them into a small discrete bucket key such as
``"short|question"``. Policies keep statistics per bucket: keyword-like
queries often favour a lexical retriever, natural-language questions a dense one.

>>> f = query_features('what does "error E1234" mean?')
>>> f["has_quote"], f["has_code"], f["is_question"]
(1.0, 1.0, 1.0)
>>> query_type(f)
'medium|code'
>>> query_type(query_features("solar wind"))
'short|keyword'
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["QUERY_TYPES", "query_features", "query_type"]

_TOKEN = re.compile(r"\w+(?:[-_./:]\w+)*", re.UNICODE)
# Han and kana are written without spaces, so a whole clause is one \w+ token; a word of Chinese or
# Japanese is about two characters. Hangul is not here: Korean separates its words by spaces.
#: the Han ideographs (CJK Unified Ideographs and Extension A), as a regex character-class range; rlfb.implicit
#: tokenises by it too
HAN = "\u3400-\u4dbf\u4e00-\u9fff"
_KANA = "\u3040-\u30ff"
_CJK_RUN = re.compile(f"[{HAN}{_KANA}]+")
_QUESTION_MARKS = ("?", "\uff1f", "\u061f")  # ASCII, full-width (CJK) and Arabic
# single quotes only where they stand apart from words: "doesn't" and "the kernel's" quote nothing
# guillemets (French, Russian, ...; German also reverses them), German low-high quotes, and CJK corner brackets
_QUOTE = re.compile(r"\"[^\"]+\"|“[^”]+”|„[^“”]+[“”]|«[^»]+»|»[^«]+«|「[^」]+」|『[^』]+』|(?<!\w)'[^']{2,}'(?!\w)")
_CODE = re.compile(
    r"""
    \b(?:[A-Za-z]+[-_]?\d+[A-Za-z0-9]*|\d+[A-Za-z]+\w*)\b   # E1234, v2, 3g, ISO-9001
    | \b\w+_\w+\b                                        # snake_case
    | \b[a-z]+[A-Z]\w*\b                                 # camelCase
    | \b\w+\(\)                                          # call() (at a word start: unanchored, quadratic)
    | [/\\]\w+[/\\]                                      # /path/
    | \b0x[0-9a-fA-F]+\b                                 # hex
    """,
    re.VERBOSE,
)
_QUESTION_WORDS = frozenset(
    "what which who whom whose when where why how is are was were do does did can could should "
    "would will may might".split()
)
_SHORT = 3  # tokens
_LONG = 12

#: Every bucket :func:`query_type` can return.
QUERY_TYPES: tuple[str, ...] = tuple(
    f"{length}|{kind}"
    for length in ("short", "medium", "long")
    for kind in ("code", "quoted", "question", "keyword")
)


def query_features(query: str) -> dict[str, float]:
    """Cheap numeric features of a query.

    Keys: ``n_tokens``, ``n_chars``, ``has_digits``, ``has_code`` (identifiers
    such as ``E1234``, ``snake_case``, ``camelCase``), ``has_quote`` (a quoted
    phrase, also in guillemets, German or CJK corner quotes), ``is_question`` (a
    leading question word or a question mark, also the full-width ``？``, the
    Arabic ``؟`` and an opening Spanish ``¿``), ``mean_token_length`` and
    ``upper_ratio`` (share of all-capital tokens). Chinese and Japanese text,
    written without spaces, counts one token per two Han or kana characters.

    >>> query_features("How do tides work?")["n_tokens"]
    4.0
    >>> query_features("极光是什么")["n_tokens"]
    3.0
    >>> f = query_features("¿qué es «aurora boreal»")
    >>> f["is_question"], f["has_quote"]
    (1.0, 1.0)
    """
    if not isinstance(query, str):
        raise TypeError(f"query must be a string, got {type(query).__name__}")
    text = query.strip()
    tokens = _TOKEN.findall(text)
    n = sum(_n_words(t) for t in tokens)
    first = tokens[0].lower() if tokens else ""
    return {
        "n_tokens": float(n),
        "n_chars": float(len(text)),
        "has_digits": float(any(ch.isdigit() for ch in text)),
        "has_code": float(bool(_CODE.search(text))),
        "has_quote": float(bool(_QUOTE.search(text))),
        # Spanish opens a question with ¿, and a question typed in haste may never close it
        "is_question": float(first in _QUESTION_WORDS or text.endswith(_QUESTION_MARKS) or "¿" in text),
        "mean_token_length": float(sum(len(t) for t in tokens) / n) if n else 0.0,
        "upper_ratio": float(sum(t.isupper() and len(t) > 1 for t in tokens) / n) if n else 0.0,
    }


def _n_words(token: str) -> int:
    """Words in one token: 1, or for Han and kana runs about one per two characters (rounded up)."""
    runs = _CJK_RUN.findall(token)
    if not runs:
        return 1
    rest = _CJK_RUN.sub(" ", token).split()  # the token's other parts ("aurora" in "aurora极光")
    return len(rest) + sum((len(r) + 1) // 2 for r in runs)


def query_type(features: Mapping[str, float]) -> str:
    """The discrete bucket of a query: ``"<length>|<kind>"``.

    Length is ``short`` (up to 3 tokens), ``medium`` (up to 12) or ``long``;
    kind is the first that applies of ``code`` (digits or identifiers),
    ``quoted``, ``question`` and ``keyword``. There are 12 buckets
    (:data:`QUERY_TYPES`), few enough for each to gather statistics.

    >>> query_type({"n_tokens": 20, "is_question": 1.0})
    'long|question'
    """
    n = float(features.get("n_tokens", 0.0))
    length = "short" if n <= _SHORT else ("medium" if n <= _LONG else "long")
    if features.get("has_code", 0.0) or features.get("has_digits", 0.0):
        kind = "code"
    elif features.get("has_quote", 0.0):
        kind = "quoted"
    elif features.get("is_question", 0.0):
        kind = "question"
    else:
        kind = "keyword"
    return f"{length}|{kind}"
