"""Builds ``data/tasks/research_bundles.jsonl``, the source bundles of the ``research_synthesis`` task.

``python -m orchestry.tasks.research_data`` rewrites the file. Each bundle is one question written for this
project and 3-5 short passages: the docstrings of standard-library functions and classes of CPython (cut at a
paragraph boundary to at most ``MAX_CHARS`` characters). CPython's source, docstrings included, is distributed
under the Python Software Foundation License Version 2 (PSF-2.0, a permissive, OSI-approved licence; its text
is ``LICENSE.txt`` of every CPython installation); each passage records it with the exact Python version and
the object it documents. The questions are the project's own.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import json
import platform
import sys
from pathlib import Path

OUT = Path("data/tasks/research_bundles.jsonl")
MAX_CHARS = 700
LICENSE = "PSF-2.0"

QUESTIONS: list[tuple[str, str, list[str]]] = [
    ("json-serialise", "How can a Python object be turned into JSON text, and what controls the output format?",
     ["json.dumps", "json.dump", "json.JSONEncoder.default"]),
    ("json-parse", "How is JSON text read back into Python objects, and how can parsing be customised?",
     ["json.loads", "json.load", "json.JSONDecoder"]),
    ("text-wrap", "How can long text be wrapped or shortened to a given width?",
     ["textwrap.wrap", "textwrap.fill", "textwrap.shorten", "textwrap.dedent"]),
    ("path-files", "How do you read and write whole files with pathlib?",
     ["pathlib.Path.read_text", "pathlib.Path.write_text", "pathlib.Path.read_bytes", "pathlib.Path.exists"]),
    ("counting", "How can you count items and find the most common ones?",
     ["collections.Counter", "collections.Counter.most_common", "collections.Counter.update"]),
    ("default-values", "How can a dictionary supply default values for missing keys?",
     ["collections.defaultdict", "dict.setdefault", "dict.get"]),
    ("sorting", "How do you sort data in Python, and how are ties and keys handled?",
     ["sorted", "list.sort", "operator.itemgetter", "functools.cmp_to_key"]),
    ("bisect", "How can a sorted list be searched and kept sorted on insertion?",
     ["bisect.bisect_left", "bisect.bisect_right", "bisect.insort_left"]),
    ("heaps", "How do you get the smallest items of a collection efficiently?",
     ["heapq.heappush", "heapq.heappop", "heapq.nsmallest", "heapq.heapify"]),
    ("caching", "How can the results of an expensive function be cached?",
     ["functools.lru_cache", "functools.cache", "functools.wraps"]),
    ("iter-combine", "Which tools combine or chain several iterables?",
     ["itertools.chain", "zip", "itertools.zip_longest", "itertools.product"]),
    ("iter-group", "How can consecutive items of an iterable be grouped or sliced?",
     ["itertools.groupby", "itertools.islice", "itertools.accumulate"]),
    ("regex-search", "How do you find text matching a regular expression?",
     ["re.search", "re.match", "re.findall", "re.fullmatch"]),
    ("regex-replace", "How can parts of a string be replaced or split with a regular expression?",
     ["re.sub", "re.split", "re.escape"]),
    ("randomness", "How do you draw random numbers and samples reproducibly?",
     ["random.seed", "random.random", "random.sample", "random.shuffle"]),
    ("statistics", "How can the centre and spread of numeric data be summarised?",
     ["statistics.mean", "statistics.median", "statistics.stdev", "statistics.quantiles"]),
    ("dates", "How do you get the current date and time and format it?",
     ["datetime.datetime.now", "datetime.datetime.strftime", "datetime.datetime.fromisoformat"]),
    ("hashing", "How can a digest of some bytes be computed?",
     ["hashlib.sha256", "hashlib.new", "hmac.new", "hmac.compare_digest"]),
    ("temp-files", "How do you create temporary files and directories safely?",
     ["tempfile.mkstemp", "tempfile.TemporaryDirectory", "tempfile.NamedTemporaryFile"]),
    ("dataclasses", "How can simple classes holding data be declared with little code?",
     ["dataclasses.dataclass", "dataclasses.field", "dataclasses.asdict", "dataclasses.replace"]),
    ("csv", "How are CSV files read and written?",
     ["csv.reader", "csv.writer", "csv.Sniffer", "csv.register_dialect"]),
    ("math-numbers", "How do you compare floating-point numbers and round them?",
     ["math.isclose", "round", "math.floor", "math.isfinite"]),
]  # fmt: skip


def _resolve(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj

    obj = builtins
    for name in parts:
        obj = getattr(obj, name)
    return obj


def passage_text(dotted: str, max_chars: int = MAX_CHARS) -> str:
    """The cleaned docstring of ``dotted``, whole paragraphs up to ``max_chars`` (the first one always).

    Raises:
        ValueError: the object has no docstring.
    """
    doc = inspect.getdoc(_resolve(dotted))
    if not doc:
        raise ValueError(f"{dotted} has no docstring")
    paragraphs = [p.strip() for p in doc.split("\n\n") if p.strip()]
    out = paragraphs[0]
    for p in paragraphs[1:]:
        if len(out) + 2 + len(p) > max_chars:
            break
        out += "\n\n" + p
    return out


def build_bundles() -> list[dict]:
    """One record per question: ``id``, ``question``, ``passages`` (``id`` P1.., ``source``, ``license``,
    ``text``)."""
    version = platform.python_version()
    out = []
    for qid, question, sources in QUESTIONS:
        passages = [
            {
                "id": f"P{i + 1}",
                "source": f"docstring of {s} (CPython {version})",
                "license": LICENSE,
                "text": passage_text(s),
            }
            for i, s in enumerate(sources)
        ]
        out.append({"id": qid, "question": question, "passages": passages})
    return out


if __name__ == "__main__":  # pragma: no cover
    bundles = build_bundles()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(b, ensure_ascii=False) + "\n" for b in bundles), encoding="utf-8")
    print(f"{len(bundles)} bundles -> {OUT} (Python {sys.version.split()[0]})")
