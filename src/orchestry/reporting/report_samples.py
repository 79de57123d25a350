"""The report sections of samples: one example of each cooperation scheme, and the best and worst transcript of
each evaluated method."""

from __future__ import annotations

import html
from pathlib import Path

from orchestry.reporting.report_format import (
    ReportError,
    _code,
    _get,
    _jsonl,
    _label,
    _num,
    _table,
)

SCHEME_DESCRIPTIONS = {
    "fallback": "main tries aux and falls back to its own logic (try/except, a None check, `aux(x) or ...`).",
    "strategy_filter": "aux's result chooses a branch (if/while/conditional test, `filter(aux, xs)`).",
    "coordinator": "main calls aux repeatedly and combines the results (loop, comprehension, `map(aux, xs)`).",
    "decorator": "main calls aux once and adds pre- or post-processing.",
    "wrapper": "main only returns aux's value.",
    "none": "aux is never called by the entry point (or the code does not parse).",
}

MISSING_SAMPLES = (
    "the per-sample files (reports/eval/*.jsonl, reports/baselines/*.jsonl, reports/schemes_samples.jsonl) "
    "are DVC outputs kept out of git; run `dvc pull` or `dvc repro` to get them."
)


def _sample_html(r: dict, title: str, css: str = "", scheme: str | None = None) -> str:
    levels = ", ".join(f"{lv} {_num(r.get(lv))}" for lv in ("structure", "syntax", "tests", "cooperation"))
    reasons = r.get("reasons") or []
    reasons_html = (
        "<ul>" + "".join(f"<li>{html.escape(str(x))}</li>" for x in reasons) + "</ul>" if reasons else ""
    )
    return (
        f'<div class="sample {css}"><h4>{html.escape(title)}</h4>'
        f"<p>{html.escape(str(r.get('task_id')))}, sample {html.escape(str(r.get('sample')))}: joint reward "
        f"<b>{_num(r.get('total'))}</b> ({levels}); {_num(r.get('passed'))}/{_num(r.get('total_asserts'))} "
        f"asserts passed; scheme <code>{html.escape(str(scheme or r.get('scheme')))}</code>.</p>{reasons_html}"
        f"<p>helper's answer</p>{_code(r.get('helper'))}<p>main's answer</p>{_code(r.get('main'))}</div>"
    )


def _records(reports: Path) -> dict[str, list[dict]]:
    """Every evaluated sample: ``{method: records}``, methods named as in ``schemes_samples.jsonl``."""
    out = {f.stem: _jsonl(f) for f in sorted((reports / "eval").glob("*.jsonl"))}
    for f in sorted((reports / "baselines").glob("*.jsonl")):
        out[f"baseline_{f.stem}"] = _jsonl(f)
    return out


def _rank(r: dict) -> tuple[float, int]:
    """Order of samples: joint reward, then passed asserts."""
    return float(r.get("total") or 0.0), int(r.get("passed") or 0)


def _schemes_section(
    schemes: dict, samples: list[dict] | None, records: dict[str, list[dict]], src: Path
) -> str:
    names = _get(schemes, "schemes", source=src)
    dist = _get(schemes, "distribution", source=src)
    table = [
        {
            "method": _label(m),
            **{s: _num(d.get(s)) for s in names},
            "samples": _num(schemes.get("samples", {}).get(m)),
        }
        for m, d in dist.items()
    ]
    head = "<p>Share of samples per scheme of main's code (test split).</p>" + _table(table)
    if samples is None:
        return head + f'<p class="note">No examples: {MISSING_SAMPLES}</p>'
    by_key = {(m, str(r.get("task_id")), str(r.get("sample"))): r for m, rs in records.items() for r in rs}
    preference = {"magrpo": 0, "base": 1}  # the trained agents first, then the base agents, then baselines
    parts = []
    for scheme in names:
        parts.append(
            f'<h3 id="scheme-{scheme}">{scheme}</h3><p>{html.escape(SCHEME_DESCRIPTIONS.get(scheme, ""))}'
        )
        candidates = []
        for i, s in enumerate(samples):
            if s.get("scheme") != scheme or s.get("method") not in records:
                continue
            r = by_key.get((s["method"], str(s.get("task_id")), str(s.get("sample"))))
            if r is None:
                raise ReportError(
                    f"{src.parent / 'schemes_samples.jsonl'}: sample {s['method']} {s.get('task_id')} "
                    f"#{s.get('sample')} is not in the method's file under reports/eval or reports/baselines"
                )
            candidates.append((preference.get(s["method"], 2), -_rank(r)[0], -_rank(r)[1], i, s["method"], r))
        if not candidates:
            seen = any(s.get("scheme") == scheme for s in samples)
            parts.append(
                f" {'Its samples are not available: ' + MISSING_SAMPLES if seen else 'No sample has this scheme.'}</p>"
            )
            continue
        *_, method, r = min(candidates, key=lambda c: c[:4])
        parts.append("</p>" + _sample_html(r, f"Example ({_label(method)})", scheme=scheme))
    return head + "".join(parts)


def _transcripts_section(reports: Path, records: dict[str, list[dict]]) -> str:
    """Best and worst sample of each evaluated method (``reports/eval``), from the records read by :func:`_records`."""
    parts = []
    for f in sorted((reports / "eval").glob("*.jsonl")):
        rows = records[f.stem]
        if not rows:
            continue
        best, worst = max(rows, key=_rank), min(rows, key=_rank)
        label = _label(f.stem)
        parts.append(
            f"<h3>{html.escape(label)}</h3>"
            + _sample_html(best, f"Best of {len(rows)} samples ({label})")
            + _sample_html(worst, f"Worst of {len(rows)} samples ({label})", "worst")
        )
    if not parts:
        return f'<p class="note">No transcripts: {MISSING_SAMPLES}</p>'
    return "<p>Highest and lowest joint reward (ties: more passed asserts, then the first).</p>" + "".join(
        parts
    )
