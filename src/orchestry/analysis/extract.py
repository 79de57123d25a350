"""Model answers reduced to code (:func:`extract_code`): a fenced block (``python`` first), the whole text when it
is code, else the text from its first definition or import cut to its longest parsable prefix."""

from __future__ import annotations

import ast
import re
import textwrap

from orchestry.analysis.code_ast import safe_parse

MAX_ANSWER_CHARS = 100_000

_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.#-]*)[^\n]*$", re.MULTILINE)
_PY_TAGS = {"python", "py", "python3", "py3", "pycon", "ipython"}
_SPECIAL_TOKEN = re.compile(r"<\|[A-Za-z0-9_]{1,40}\|>")
_CODE_START = re.compile(r"^(?:@|def |async def |class |import |from \S+ import )", re.MULTILINE)
_MAX_TRIM_TRIES = 64


def _clean(code: str) -> str:
    code = textwrap.dedent(code)
    lines = code.splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(line.rstrip() for line in lines) + ("\n" if lines else "")


def _longest_parsable_prefix(code: str) -> str:
    """``code`` cut before trailing prose: the longest prefix ending before a column-0 line that parses."""
    if safe_parse(code) is not None:
        return code
    lines = code.splitlines()
    cuts = [i for i in range(1, len(lines)) if lines[i][:1] not in ("", " ", "\t")]
    for tries, cut in enumerate(reversed(cuts)):
        if tries >= _MAX_TRIM_TRIES:
            break
        prefix = "\n".join(lines[:cut])
        if safe_parse(prefix) is not None:
            return prefix
    return code


def extract_code(text: str, max_chars: int = MAX_ANSWER_CHARS) -> tuple[str, str]:
    """The code of a model answer, and why none was found.

    Rules, first match wins:

    1. the answer starts inside a code block (the prompt ended with a fence): when the first fence line has
       no language tag and a line starting with ``def``/``class``/``import``/``@`` precedes it, the text
       from that line up to the fence (even if it does not parse: the syntax level reports it);
    2. the first fenced block tagged ``python`` (``py``, ``python3``, ...), else the first untagged block;
       an unclosed fence (a truncated answer) runs to the end of the text, cut to its longest prefix that
       parses before a column-0 line (its finished top-level statements: a function cut in the middle is
       dropped, the complete ones before it are kept; nothing is dropped if no such prefix parses);
    3. the whole text, if it parses and holds a statement other than a bare expression (so that prose
       which happens to parse, such as ``Sure`` or ``Done``, is not taken for code);
    4. unfenced code mixed with prose: from the first line starting with ``def``/``class``/``import``/``@``
       to the longest following prefix that parses (or to the end, for the syntax level to report).

    Special tokens such as ``<|im_end|>`` are removed and the code is dedented.

    Args:
        text: the model's answer (any object: non-strings give a reason, never an exception).
        max_chars: longer answers are refused (a reason, not an exception), to bound the work.

    Returns:
        ``(code, reason)``: ``reason`` is ``""`` on success, otherwise e.g. ``"no code block found"`` and
        ``code`` is ``""``.
    """
    if not isinstance(text, str):
        return "", f"answer is not text ({type(text).__name__})"
    if len(text) > max_chars:
        return "", f"answer too long ({len(text)} characters > {max_chars})"
    text = _SPECIAL_TOKEN.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    if not text.strip():
        return "", "empty answer"
    fences = list(_FENCE.finditer(text))
    if fences:
        first = fences[0]
        head = text[: first.start()]
        start = _CODE_START.search(head)
        if not first.group(1) and start is not None:
            return _clean(head[start.start() :]), ""
        blocks: list[tuple[str, str]] = []
        for i in range(0, len(fences), 2):
            opening = fences[i]
            closing = fences[i + 1] if i + 1 < len(fences) else None
            if closing is not None:
                body = text[opening.end() + 1 : closing.start()]
            else:  # cut inside the block: keep its finished statements (an unfinished tail never counts)
                body = _longest_parsable_prefix(textwrap.dedent(text[opening.end() + 1 :]).rstrip())
            blocks.append((opening.group(1).lower(), body))
        for wanted in (_PY_TAGS, {""}):
            for tag, body in blocks:
                if tag in wanted and body.strip():
                    return _clean(body), ""
        tags = sorted({t for t, _ in blocks if t})
        return "", "no python code block found" + (f" (only {', '.join(tags)})" if tags else "")
    tree = safe_parse(text)
    if tree is not None and any(not isinstance(stmt, ast.Expr) for stmt in tree.body):
        return _clean(text), ""
    start = _CODE_START.search(text)
    if start is None:
        return "", "no code block found"
    return _clean(_longest_parsable_prefix(text[start.start() :])), ""
