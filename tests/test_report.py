"""reports/index.html (orchestry.reporting.report): built from the repository's real reports/, opened in headless Chromium.

Every test works on a copy of reports/ under tmp_path; the repository's reports/ is never written, except
``reports/screenshots/index.png`` when ``ORCHESTRY_SAVE_SCREENSHOT=1`` (a 1280 x 6000 screenshot of the page).
The browser tests need Debian's ``chromium`` (``make setup`` installs it as root) and skip without it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import yaml

from orchestry.algorithms.orchestrator import step_rewards
from orchestry.reporting.report import FIGURES, OBJECTIVE_LABEL, ReportError, ui_address, write_report
from orchestry.tracking.runs import stage_run
from orchestry.tracking.ui import ui_base

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian package `chromium`)")
PER_SAMPLE = ("eval", "baselines", "schemes_samples.jsonl")  # DVC outputs kept out of git
# an excerpt of those (and of the cached reports/api_grpo/rewards.csv) from a real run, for fresh clones
SAMPLE_EXCERPT = Path(__file__).resolve().parent / "data" / "reports_per_sample"


def _copy_reports(dst: Path) -> Path:
    """A copy of the repository's reports/ (without a previous index.html or screenshots) under ``dst``."""
    src = ROOT / "reports"
    assert (src / "metrics.json").is_file(), "the repository has no reports/metrics.json"
    shutil.copytree(src, dst / "reports", ignore=shutil.ignore_patterns("index.html", "screenshots"))
    # a fresh clone lacks the DVC-cached per-sample files (no DVC remote): use a committed excerpt of them
    for f in sorted(SAMPLE_EXCERPT.rglob("*")):
        target = dst / "reports" / f.relative_to(SAMPLE_EXCERPT)
        if f.is_file() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, target)
    return dst / "reports"


class _Page(HTMLParser):
    """Image sources, link targets and element ids of an HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "img":
            self.images.append(a.get("src") or "")
        elif tag == "a" and a.get("href") is not None:
            self.links.append(a["href"])
        elif tag == "script":
            self.scripts += 1


def _parse(page: Path) -> _Page:
    p = _Page()
    p.feed(page.read_text(encoding="utf-8"))
    return p


def _mlflow_link(url) -> bool:
    """A link into the MLflow UI that ``orchestry ui`` serves (an experiment's page or a run's)."""
    return f"{url.scheme}://{url.netloc}" == ui_address() and url.fragment.startswith("/experiments/")


def broken_references(page: Path) -> list[str]:
    """Every ``<img src>`` and ``<a href>`` of ``page`` that is not an existing file (relative to the page's
    folder) or an id of the page; anything with a scheme or host (network) counts as broken, except an ``<a>``
    into the MLflow UI of ``orchestry ui`` (the provenance and figure links of a page built in a stage run)."""
    parsed = _parse(page)
    bad = []
    for kind, refs in (("img", parsed.images), ("a", parsed.links)):
        for ref in refs:
            url = urlparse(ref)
            if kind == "a" and _mlflow_link(url):
                continue
            if url.scheme or url.netloc or not (url.path or url.fragment):
                bad.append(f"{kind} {ref!r}: not a relative link")
            elif not url.path:
                if url.fragment not in parsed.ids:
                    bad.append(f"{kind} {ref!r}: no element with this id")
            elif not (page.parent / unquote(url.path)).is_file():
                bad.append(f"{kind} {ref!r}: no such file")
    return bad


# a test-only script: after load, the page lists each image's natural width (0 when it did not load)
PROBE = """<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "image-probe";
  out.textContent = JSON.stringify(Array.from(document.images, (i) => [i.getAttribute("src"), i.naturalWidth]));
  document.body.appendChild(out);
});
</script>"""


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={tmp / 'chromium-profile'}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)


def image_widths(page: Path, tmp: Path) -> list[tuple[str, int]]:
    """``(src, naturalWidth)`` of every image of ``page`` as Chromium loaded it from disk."""
    probe = page.with_name(page.stem + ".probe.html")  # same folder, so relative links resolve the same
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    try:
        run = _chromium(tmp, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri())
    finally:
        probe.unlink()
    m = re.search(r'<pre id="image-probe">(.*?)</pre>', run.stdout, re.S)
    assert m, f"chromium did not run the probe (exit {run.returncode}): {run.stderr[-500:]}"
    return [(src, int(w)) for src, w in json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))]


# a test-only script: after load, the page lists the width of the document and, per table of the first screen
# (provenance and results), its right edge, its width and its container's width (CSS pixels)
LAYOUT_PROBE = """<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "layout-probe";
  const tables = Array.from(document.querySelectorAll("#provenance table, #shows table"), (t) => ({
    section: t.closest("section").id, right: t.getBoundingClientRect().right, width: t.scrollWidth,
    room: t.parentElement.clientWidth}));
  out.textContent = JSON.stringify({page: document.documentElement.scrollWidth, viewport: window.innerWidth, tables});
  document.body.appendChild(out);
});
</script>"""


def first_screen_layout(page: Path, tmp: Path, width: int) -> dict:
    """What :data:`LAYOUT_PROBE` measures of ``page`` in Chromium with a ``width`` px wide window."""
    probe = page.with_name(page.stem + ".layout.html")
    probe.write_text(
        page.read_text(encoding="utf-8").replace("</body>", LAYOUT_PROBE + "</body>"), encoding="utf-8"
    )
    try:
        run = _chromium(
            tmp, f"--window-size={width},900", "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()
        )
    finally:
        probe.unlink()
    m = re.search(r'<pre id="layout-probe">(.*?)</pre>', run.stdout, re.S)
    assert m, f"chromium did not run the probe (exit {run.returncode}): {run.stderr[-500:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """reports/index.html made from a copy of the repository's reports/."""
    tmp = tmp_path_factory.mktemp("report")
    _copy_reports(tmp)
    return write_report(tmp)


def test_report_has_every_section_figure_and_method(built):
    html = built.read_text(encoding="utf-8")
    parsed = _parse(built)
    reports = built.parent
    metrics = json.loads((reports / "metrics.json").read_text())
    for sid in ("metrics", "magrpo", "api-grpo", "orchestrator", "cost", "figures", "schemes", "transcripts"):
        assert sid in parsed.ids, f"no section {sid}"
    figures = sorted(f"figures/{f.name}" for f in (reports / "figures").glob("*.png"))
    assert sorted(parsed.images) == figures  # every figure, once each
    for name in ("learning_curves.png", "scheme_evolution.png"):  # per-level curves, scheme evolution
        assert f"figures/{name}" in figures and escape(FIGURES[name]) in html
    m = metrics["methods"]["magrpo"]
    ci = f"{m['reward']:.2f} [{m['reward_ci_low']:.2f}, {m['reward_ci_high']:.2f}]"
    assert ci in re.sub(r"<[^>]+>", "", html)  # the metrics table shows the interval from metrics.json
    # the results table: pass@k at the largest k evaluated and the collapse columns beside pass@1
    k = max(int(key.split("@")[1]) for key in m if key.startswith("pass@"))
    assert all(f"<th>{h}</th>" in html for h in ("pass@k", "chain form", "distinct"))
    assert f"{m[f'pass@{k}']:.2f} (k={k})" in html
    for label in ("MAGRPO-trained agents", "base agents (no training)", "API-GRPO", "learned orchestrator"):
        assert label in html
    assert parsed.scripts == 0 and "http://" not in html and "https://" not in html  # self-contained
    assert html.count("Best of ") >= 1 and html.count("Worst of ") >= 1
    for scheme in json.loads((reports / "schemes.json").read_text())["schemes"]:
        assert f'id="scheme-{scheme}"' in html


def test_report_shows_one_example_of_each_scheme_seen(built):
    reports = built.parent
    html = built.read_text(encoding="utf-8")
    seen = {
        r["scheme"] for r in map(json.loads, (reports / "schemes_samples.jsonl").read_text().splitlines())
    }
    for scheme in seen:
        section = html.split(f'id="scheme-{scheme}"')[1].split("<h3")[0]
        assert "Example (" in section and f"scheme <code>{scheme}</code>" in section


def test_every_image_and_link_resolves(built):
    assert broken_references(built) == []
    parsed = _parse(built)
    assert len(parsed.images) >= len(FIGURES) and any(h.endswith("metrics.json") for h in parsed.links)


def test_a_broken_image_or_link_is_detected(built, tmp_path):
    page = built.read_text(encoding="utf-8")
    bad = built.with_name("bad.html")
    bad.write_text(
        page.replace('src="figures/methods.png"', 'src="figures/missing.png"', 1).replace(
            'href="#cost"', 'href="#nowhere"', 1
        ),
        encoding="utf-8",
    )
    try:
        assert broken_references(bad) == [
            "img 'figures/missing.png': no such file",
            "a '#nowhere': no element with this id",
        ]
    finally:
        bad.unlink()


@needs_chromium
def test_chromium_loads_every_image_and_saves_a_screenshot(built, tmp_path):
    widths = image_widths(built, tmp_path)
    assert sorted(src for src, _ in widths) == sorted(_parse(built).images)
    assert all(w > 0 for _, w in widths), f"images that did not load: {[s for s, w in widths if w == 0]}"
    shot = tmp_path / "index.png"
    run = _chromium(tmp_path, "--window-size=1280,6000", f"--screenshot={shot}", built.as_uri())
    assert shot.is_file(), f"no screenshot (exit {run.returncode}): {run.stderr[-500:]}"
    from PIL import Image

    with Image.open(shot) as im:
        assert im.size == (1280, 6000)
        assert len(im.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 100  # text and figures, not blank
    if os.environ.get("ORCHESTRY_SAVE_SCREENSHOT") == "1":
        dst = ROOT / "reports" / "screenshots" / "index.png"
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, dst)


@needs_chromium
def test_the_first_screen_fits_1280_px_without_scrolling_sideways(built, tmp_path):
    """Chromium at 1280 px: the provenance table (with the long machine line) and the results table fit their
    1200 px column, so no cell lies outside the window or behind a table's own scroll bar."""
    layout = first_screen_layout(built, tmp_path, 1280)
    assert layout["viewport"] == 1280 and layout["page"] <= 1280, layout
    assert {t["section"] for t in layout["tables"]} == {"provenance", "shows"}, layout
    for t in layout["tables"]:
        assert t["width"] <= t["room"] and t["right"] <= 1280, t


def test_table_cells_wrap_and_keep_each_interval_on_one_line(built):
    """Without a browser: no rule keeps a table cell on one line (the cause of the 1,623 px provenance table),
    each ``[low, high]`` is one unbreakable span, and the provenance values are aligned left."""
    from orchestry.reporting.report import CSS

    assert not re.search(r"table\.data td\s*\{[^}]*nowrap", CSS)
    assert re.search(r"table\.data \.ci\s*\{[^}]*white-space: nowrap", CSS)
    page = built.read_text(encoding="utf-8")
    shows = page.split('<section id="shows">')[1].split("</section>")[0]
    assert re.search(
        r'<td>[+-]?\d\.\d\d <span class="ci">\[[+-]?\d\.\d\d, [+-]?\d\.\d\d\]</span></td>', shows
    )
    provenance = page.split('<section id="provenance">')[1].split("</section>")[0]
    assert 'class="dataframe data kv"' in provenance


@needs_chromium
def test_chromium_check_catches_an_image_that_does_not_load(built, tmp_path):
    bad = built.with_name("broken.html")
    bad.write_text(
        built.read_text(encoding="utf-8").replace(
            'src="figures/methods.png"', 'src="figures/missing.png"', 1
        ),
        encoding="utf-8",
    )
    try:
        widths = dict(image_widths(bad, tmp_path))
    finally:
        bad.unlink()
    assert widths["figures/missing.png"] == 0
    assert widths["figures/learning_curves.png"] > 0


def test_without_the_per_sample_files_the_page_says_so(tmp_path):
    reports = _copy_reports(tmp_path)
    for name in PER_SAMPLE:
        p = reports / name
        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    page = write_report(tmp_path, Path("reports/index.html"))
    html = page.read_text(encoding="utf-8")
    assert "No transcripts:" in html and "No examples:" in html and "dvc pull" in html
    assert broken_references(page) == []  # no link to the absent files


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda r: (r / "metrics.json").unlink(), r"missing input .*reports/metrics\.json$"),
        (lambda r: (r / "train/magrpo.json").write_text("{not json"), r"cannot read .*train/magrpo\.json: "),
        (
            lambda r: (r / "metrics.json").write_text('{"intervals": {}}'),
            r"metrics\.json: missing key methods$",
        ),
        (lambda r: [f.unlink() for f in (r / "figures").glob("*.png")], r"no figure in .*figures"),
    ],
    ids=["missing", "malformed", "missing-key", "no-figures"],
)
def test_bad_input_is_one_clear_line(tmp_path, damage, message):
    reports = _copy_reports(tmp_path)
    damage(reports)
    with pytest.raises(ReportError, match=message) as e:
        write_report(tmp_path)
    assert "\n" not in str(e.value)
    assert not (reports / "index.html").exists()


def _run_plot_stage(cwd: Path) -> subprocess.CompletedProcess:
    """stages/plot.py in ``cwd`` (its own params.yaml, reports/ and MLflow store ``cwd/mlflow.db``)."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["plot"]["dpi"] = 50  # the lowest allowed: smaller figures, same code path
    (cwd / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "MLFLOW_ENABLE_ASYNC_LOGGING": "false", "OMP_NUM_THREADS": "1"}
    env.pop("DVC_ROOT", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [sys.executable, str(ROOT / "stages/plot.py")]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=240, check=False)


def test_plot_stage_fails_in_one_line_when_the_report_cannot_be_built(tmp_path):
    """The real stage (its success is covered by tests/test_pipeline.py's dvc repro): the figures are made,
    then a report that cannot be built fails the stage, exit 1, with one error line naming the bad input."""
    reports = _copy_reports(tmp_path)
    (reports / "schemes_samples.jsonl").write_text("{broken\n")
    for f in (reports / "figures").glob("*.png"):
        f.unlink()
    run = _run_plot_stage(tmp_path)
    err = run.stderr
    assert run.returncode == 1, err[-2000:]
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("error: reports/index.html not built: cannot read reports/schemes_samples.jsonl: ")
    )
    assert "Traceback" not in err
    assert not (reports / "index.html").exists()
    assert set(FIGURES) <= {f.name for f in (reports / "figures").glob("*.png")}  # the stage got that far


# ---------------------------------------------------------------- the orchestrator's objective, provenance


def _orchestrator_table(page: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the first table of the orchestrator section."""
    section = page.split('<section id="orchestrator">')[1].split("</table>")[0]
    header = [re.sub(r"<[^>]+>", "", h).strip() for h in re.findall(r"<th[^>]*>(.*?)</th>", section, re.S)]
    rows = [
        [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", section.split("<tbody>")[1], re.S)
    ]
    return header, rows


def test_the_orchestrator_objective_column_says_what_it_holds(built):
    """The label's formula, applied to the shown reward and cost, gives the shown objective (to rounding), and
    the trainer's rewards (Puppeteer's, docs/orchestrator.md) sum to that formula."""
    from html import unescape

    summary = json.loads((built.parent / "orchestrator" / "summary.json").read_text())
    lam = summary["cost_lambda"]
    header, rows = _orchestrator_table(built.read_text(encoding="utf-8"))
    label = unescape(OBJECTIVE_LABEL)
    assert label in header
    m = re.fullmatch(r"objective = reward − (\d*)λ·cost", label)
    assert m, label
    k = float(m.group(1) or 1)
    # the trainer's return of one episode: costs 100 and 50 tokens, task reward 1.5
    assert sum(step_rewards([100.0, 50.0], 1.5, lam)) == pytest.approx(1.5 - k * lam * 150.0)
    col = {name: header.index(name) for name in header}
    cost_col = next(c for c in header if c.startswith("cost ("))
    assert rows
    for row in rows:
        reward = float(row[col["task reward"]].split()[0])
        cost = float(row[col[cost_col]].split()[0].replace(",", ""))
        objective = float(row[col[label]].split()[0])
        # shown reward has 2 decimals and cost 0: allow that rounding
        assert objective == pytest.approx(reward - k * lam * cost, abs=0.006 + k * lam * 0.5), row
    for name, s in summary["eval"]["methods"].items():  # and exactly, on the summary's own means
        expected = s["task_reward"]["mean"] - k * lam * s["cost"]["mean"]
        assert s["objective"]["mean"] == pytest.approx(expected, abs=1e-3), name


def test_the_page_states_its_provenance(built):
    page = built.read_text(encoding="utf-8")
    section = page.split('<section id="provenance">')[1].split("</section>")[0]
    empty = __import__("hashlib").sha256(b"").hexdigest()  # the copy has no params.yaml
    for part in ("made (UTC)", "git revision", empty, "none (the workspace)", "No MLflow run links"):
        assert part in section, part
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", section)


def test_provenance_names_the_machine_that_trained():
    from orchestry.reporting.report import _provenance_section, _training_machine

    assert _training_machine({}) is None  # an empty report
    assert _training_machine({"steps": 2}) is None  # a report from before the machine was recorded
    machine = {"cpu": "Test CPU 9000", "cpu_flags": "avx2", "threads": 2, "torch": "2.13.0", "kernels": "AVX2",
               "mkl_cbwr": "AUTO", "numerics": "native", "gpu": "none"}  # fmt: skip
    line = _training_machine({"machine": machine, "update_dtype": "fp32"})
    for part in ("Test CPU 9000", "2 threads", "AVX2 kernels", "numerics native", "update fp32"):
        assert part in line, part
    assert "Test CPU 9000" in _provenance_section({}, line)
    assert "not recorded" in _provenance_section({}, None)


def test_the_page_names_the_machine_of_the_committed_training(built):
    section = built.read_text(encoding="utf-8").split('<section id="provenance">')[1].split("</section>")[0]
    machine = json.loads((ROOT / "reports" / "train" / "magrpo.json").read_text())["machine"]
    assert f"{machine['threads']} threads" in section and machine["kernels"] in section


def test_a_page_built_in_a_stage_run_links_its_mlflow_runs(tmp_path, monkeypatch):
    import mlflow

    _copy_reports(tmp_path)
    (tmp_path / "params.yaml").write_text("plot:\n  dpi: 50\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.setenv("DVC_EXP_NAME", "exp-report")
    monkeypatch.setenv(
        "MLFLOW_UI_URL", "http://127.0.0.1:5123/"
    )  # where `orchestry ui` serves (default 5000)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    try:
        with stage_run("evaluate", {}, "orchestry", uri=uri) as evaluate:
            pass
        with stage_run("plot", {}, "orchestry", uri=uri) as plot:
            page = write_report(tmp_path)
    finally:
        mlflow.set_tracking_uri(None)
    client = mlflow.MlflowClient(uri)
    parent = client.get_run(plot.data.tags["mlflow.parentRunId"])
    exp = plot.info.experiment_id
    html = page.read_text(encoding="utf-8")
    section = html.split('<section id="provenance">')[1].split("</section>")[0]
    base, view = "http://127.0.0.1:5123", "?workflowType=machine_learning"  # the runs view, not GenAI's pages
    assert ui_address() == base and "5000" not in section
    for run_id in (parent.info.run_id, evaluate.info.run_id, plot.info.run_id):
        assert f'href="{base}/#/experiments/{exp}/runs/{run_id}{view}"' in section
    assert "exp-report" in section and parent.data.tags["params_hash"] in section
    for fig in (page.parent / "figures").glob("*.png"):  # each figure links its artifact in the plot run
        assert (
            f'href="{base}/#/experiments/{exp}/runs/{plot.info.run_id}/artifacts/figures/{fig.name}{view}"'
            in html
        )
    assert broken_references(page) == []


def test_the_mlflow_address_is_mlflow_ui_url_else_orchestry_ui_s_default(monkeypatch):
    monkeypatch.delenv("MLFLOW_UI_URL", raising=False)
    assert ui_address() == ui_base() == "http://127.0.0.1:5000"
    monkeypatch.setenv("MLFLOW_UI_URL", " http://laptop.local:8080/mlflow/ ")
    assert ui_address() == "http://laptop.local:8080/mlflow"
