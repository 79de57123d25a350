"""dvc.yaml declares exactly what each stage reads, derived from the code (so the list cannot drift).

For every stage (matrix stages expanded by DVC itself):

* source files: the stage script and every ``orchestry`` module it imports, transitively (module- and
  function-level imports, packages resolved to their ``__init__.py``, relative imports; ``if TYPE_CHECKING:``
  blocks never run and are skipped; a sibling file or package named in a string counts as read, a package with
  every file in it, such as the sandbox's ``child`` package, which it compiles and runs as a program; empty files
  such as today's ``__init__.py`` run nothing and are left out). Each must be a dep, and no other source file may be one.
* params: every ``params.<section>[.<key>]`` the script reads (directly, through an alias such as
  ``cfg = params.evaluate``, or inside an ``orchestry`` function it hands ``params`` to) must be declared.
  ``mlflow`` is exempt: it says where runs are logged, not what a stage computes.
* data: a path literal in the script that is (under) another stage's output, and a path-valued param the
  script reads (``model.path``), must be a dep.
"""

from __future__ import annotations

import ast
import shlex
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PKG = "orchestry"
EXEMPT_SECTIONS = {"mlflow"}  # where MLflow runs go; no stage output depends on it
LOGGING_ONLY = {"model_dump"}  # `cfg.model_dump()` is logged to MLflow, not computed with


# ---------------------------------------------------------------- source files: an AST walk over imports


def _module_file(dotted: str) -> Path | None:
    """File of an ``orchestry`` module or package (``__init__.py``); None if there is none."""
    base = SRC.joinpath(*dotted.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def _module_name(f: Path) -> str:
    parts = list(f.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:`` (its ``else`` branch does run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _with_parents(dotted: str) -> list[str]:
    """``a.b.c`` -> ``a``, ``a.b``, ``a.b.c`` (importing a module runs each parent package's __init__)."""
    parts = dotted.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _direct_reads(f: Path) -> set[Path]:
    """Files of the orchestry modules ``f`` imports, and sibling files it names in strings."""
    tree = ast.parse(f.read_text(), str(f))
    in_pkg = f.is_relative_to(SRC)
    package = ""
    if in_pkg:
        package = _module_name(f) if f.name == "__init__.py" else _module_name(f).rpartition(".")[0]
    names: set[str] = set()
    out: set[Path] = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert in_pkg, f"{f}: relative import outside the package"
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names.add(mod)
            names.update(f"{mod}.{a.name}" for a in node.names)  # submodules (`from pkg import mod`)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and in_pkg:
            sibling = f.parent / node.value
            if node.value.endswith(".py") and "/" not in node.value and sibling.is_file():
                out.add(sibling)
            elif node.value.isidentifier() and (sibling / "__init__.py").is_file():
                out.update(sibling.glob("*.py"))  # e.g. the sandbox runs its child package as a program
    for name in names:
        if name == PKG or name.startswith(PKG + "."):
            for part in _with_parents(name):
                mf = _module_file(part)
                if mf is not None:
                    out.add(mf)
    return out


@cache
def source_files(script: str) -> frozenset[str]:
    """The script and every orchestry file it reads at run time, transitively (repo-relative paths).

    Empty files (the packages' ``__init__.py``) are left out: they run nothing, and DVC warns about every empty
    dep on each command. Once one holds code, it is required like any other module.
    """
    seen: set[Path] = set()
    todo = [ROOT / script]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        todo.extend(_direct_reads(f) - seen)
    return frozenset(str(p.relative_to(ROOT)) for p in seen if p.stat().st_size > 0)


# ---------------------------------------------------------------- params read through `params.<section>`


def _attr_chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ``["a", "b", "c"]``; None for anything that is not a plain name/attribute chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _params_reads(tree: ast.AST, var: str, sections: set[str]) -> set[str]:
    """``section`` or ``section.key`` read from the ``Params`` object named ``var`` in ``tree``."""
    aliases: dict[str, str] = {}  # cfg -> "evaluate"
    # the longest chains only: `params.model.path` is a read of model.path, not of the whole section
    skip = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            chain = _attr_chain(node.value)
            if chain and len(chain) == 2 and chain[0] == var and chain[1] in sections:
                aliases[node.targets[0].id] = chain[1]
                skip.add(id(node.value))  # `cfg = params.evaluate` reads nothing by itself
    reads: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in skip:
            continue
        chain = _attr_chain(node)
        if not chain:
            continue
        if chain[0] == var and len(chain) >= 2 and chain[1] in sections:
            path = chain[1:]
        elif chain[0] in aliases:
            path = [aliases[chain[0]], *chain[1:]]
        else:
            continue
        if len(path) >= 2 and path[1] in LOGGING_ONLY:
            continue
        reads.add(".".join(path[:2]))
    # a whole section handed on (`run(params.sampling)`, `Trainer(cfg)`) is a read of the whole section
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                chain = _attr_chain(arg)
                if chain and len(chain) == 2 and chain[0] == var and chain[1] in sections:
                    reads.add(chain[1])
                elif chain and len(chain) == 1 and chain[0] in aliases:
                    reads.add(aliases[chain[0]])
    return reads


def _orchestry_functions(script_tree: ast.AST) -> dict[str, ast.FunctionDef]:
    """Functions the script imports by name from orchestry modules: local name -> definition."""
    out = {}
    for node in ast.walk(script_tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PKG):
            mf = _module_file(node.module)
            if mf is None:
                continue
            defs = {
                d.name: d
                for d in ast.parse(mf.read_text()).body
                if isinstance(d, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            for a in node.names:
                if a.name in defs:
                    out[a.asname or a.name] = defs[a.name]
    return out


def params_read(script: str, sections: set[str]) -> set[str]:
    """Params the script reads, itself or in the orchestry functions it passes the whole ``params`` to."""
    tree = ast.parse((ROOT / script).read_text())
    reads = _params_reads(tree, "params", sections)
    funcs = _orchestry_functions(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in funcs):
            continue
        fdef = funcs[node.func.id]
        argnames = [a.arg for a in fdef.args.posonlyargs + fdef.args.args]
        for i, arg in enumerate(node.args):
            if isinstance(arg, ast.Name) and arg.id == "params" and i < len(argnames):
                reads |= _params_reads(fdef, argnames[i], sections)
        for kw in node.keywords:
            if isinstance(kw.value, ast.Name) and kw.value.id == "params" and kw.arg:
                reads |= _params_reads(fdef, kw.arg, sections)
    return {r for r in reads if r.split(".")[0] not in EXEMPT_SECTIONS}


# ---------------------------------------------------------------- the stages, as DVC reads them


@cache
def dvc_stages() -> tuple[dict, ...]:
    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        stages = []
        for s in repo.index.stages:
            params = sorted({p for d in s.params for p in d.params})
            stages.append(
                {
                    "name": s.addressing,
                    "cmd": s.cmd,
                    "deps": [d.def_path for d in s.deps if d not in s.params],
                    "params": params,
                    "outs": [o.def_path for o in s.outs],
                }
            )
    return tuple(stages)


def _script(cmd: str) -> str:
    args = shlex.split(cmd)
    scripts = [a for a in args if a.endswith(".py")]
    assert args[0] == "python" and len(scripts) == 1, f"unexpected stage command {cmd!r}"
    return scripts[0]


def _norm(p: str) -> str:
    return str(Path(p))


def _under(path: str, folder: str) -> bool:
    return Path(path) == Path(folder) or Path(folder) in Path(path).parents


def _is_source(dep: str) -> bool:
    return _under(dep, "src") or _under(dep, "stages")


def _params_yaml() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


STAGE_NAMES = [s["name"] for s in dvc_stages()]


def _stage(name: str) -> dict:
    return next(s for s in dvc_stages() if s["name"] == name)


@pytest.mark.parametrize("name", STAGE_NAMES)
def test_stage_depends_on_exactly_the_source_files_it_runs(name):
    stage = _stage(name)
    needed = source_files(_script(stage["cmd"]))
    declared = [_norm(d) for d in stage["deps"]]
    missing = sorted(f for f in needed if not any(_under(f, d) for d in declared))
    extra = sorted(d for d in declared if _is_source(d) and d not in needed)
    msg = []
    if missing:
        msg.append(
            f"stage {name}: missing deps (imported/run by {_script(stage['cmd'])}): " + ", ".join(missing)
        )
    if extra:
        msg.append(f"stage {name}: deps that the stage never runs (or empty files): " + ", ".join(extra))
    assert not msg, "\n".join(msg)


@pytest.mark.parametrize("name", STAGE_NAMES)
def test_stage_declares_the_params_it_reads(name):
    from orchestry.config import Params

    stage = _stage(name)
    reads = params_read(_script(stage["cmd"]), set(Params.model_fields))
    declared = set(stage["params"])

    def covered(r: str) -> bool:
        section = r.split(".")[0]
        return r in declared or section in declared

    missing = sorted(r for r in reads if not covered(r))
    assert not missing, f"stage {name}: params read but not declared: " + ", ".join(missing)


@pytest.mark.parametrize("name", STAGE_NAMES)
def test_stage_depends_on_the_outputs_it_reads(name):
    stage = _stage(name)
    script = _script(stage["cmd"])
    others = [_norm(o) for s in dvc_stages() if s["name"] != name for o in s["outs"]]
    own = [_norm(o) for o in stage["outs"]]
    deps = [_norm(d) for d in stage["deps"]]
    tree = ast.parse((ROOT / script).read_text())
    in_fstrings = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    literals = {  # f-strings (`f"reports/eval/{name}.jsonl"`) are the stage's own outputs here
        _norm(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and id(n) not in in_fstrings
        and "/" in n.value
        and "\n" not in n.value
    }
    # path-valued params the stage reads (model.path -> models/base)
    from orchestry.config import Params

    values = _params_yaml()
    for r in params_read(script, set(Params.model_fields)):
        v = values
        for part in r.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        if isinstance(v, str) and "/" in v:
            literals.add(_norm(v))
    missing = []
    for lit in sorted(literals):
        if any(_under(lit, o) for o in own):
            continue
        written = any(_under(lit, o) for o in others)  # a file or folder another stage writes
        holds = any(_under(o, lit) for o in others)  # a folder holding other stages' outputs
        if (written and not any(_under(lit, d) for d in deps)) or (
            not written and holds and not any(_under(d, lit) or _under(lit, d) for d in deps)
        ):
            missing.append(lit)
    assert not missing, f"stage {name}: reads other stages' outputs not in its deps: " + ", ".join(missing)


def test_the_walk_finds_function_level_relative_and_string_named_files():
    """The analysis itself: prepare imports llm.local inside main(); the sandbox runs its child package."""
    files = source_files("stages/prepare.py")
    assert "src/orchestry/llm/local.py" in files
    assert (
        "src/orchestry/llm/__init__.py" not in files
    )  # empty, so not a dep; but the walk does see packages:
    assert SRC / "orchestry" / "llm" / "__init__.py" in _direct_reads(ROOT / "src/orchestry/runtime.py")
    child = {str(f.relative_to(ROOT)) for f in (SRC / "orchestry/sandbox/child").glob("*.py")}
    assert {"src/orchestry/sandbox/child/boot.py", "src/orchestry/sandbox/child/scorer.py"} <= child <= files
    from orchestry.config import Params

    reads = params_read("stages/evaluate.py", set(Params.model_fields))
    assert {"evaluate.num_samples", "sandbox.timeout_s", "model.path", "sampling"} <= reads


@pytest.mark.parametrize("name", [n for n in STAGE_NAMES if "@" not in n])
def test_checkpoint_resume_key_covers_every_file_the_stage_runs(name):
    """``runtime.stage_inputs_key`` (train_magrpo's resume key) hashes the same deps and params as DVC."""
    from orchestry.runtime import stage_inputs

    deps, params = stage_inputs(name, ROOT / "dvc.yaml")
    stage = _stage(name)
    assert sorted(map(_norm, deps)) == sorted(map(_norm, stage["deps"]))
    assert sorted(params) == stage["params"]
    missing = sorted(source_files(_script(stage["cmd"])) - set(map(_norm, deps)))
    assert not missing, f"stage {name}: files the resume key does not hash: " + ", ".join(missing)


def test_stage_inputs_refuses_templated_stages(tmp_path):
    from orchestry.runtime import stage_inputs

    dvc_yaml = tmp_path / "dvc.yaml"
    dvc_yaml.write_text(
        "stages:\n  sweep:\n    matrix:\n      seed: [0, 1]\n    cmd: python run.py --seed ${item.seed}\n"
        "    deps:\n      - run.py\n    outs:\n      - out/${item.seed}.json\n"
    )
    with pytest.raises(ValueError, match="templated"):
        stage_inputs("sweep", dvc_yaml)


# ---------------------------------------------------------------- dvc.yaml hygiene: metrics and plots once


def _entries(items) -> list[str]:
    return [_norm(i if isinstance(i, str) else next(iter(i))) for i in items or []]


def test_each_plot_and_metric_is_declared_once_and_every_table_or_figure_is_a_plot():
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    plots = _entries(spec.get("plots"))
    metrics = _entries(spec.get("metrics"))
    files = []  # every file a stage declares (outs, metrics, plots)
    for stage in spec["stages"].values():
        if "matrix" in stage or "foreach" in stage:
            continue
        plots += _entries(stage.get("plots"))
        metrics += _entries(stage.get("metrics"))
        files += [f for key in ("outs", "metrics", "plots") for f in _entries(stage.get(key))]
    for kind, paths in (("plot", plots), ("metric", metrics), ("stage output", files)):
        twice = sorted({p for p in paths if paths.count(p) > 1})
        assert not twice, f"declared more than once as a {kind} in dvc.yaml: " + ", ".join(twice)
    tables = sorted(f for f in files if Path(f).suffix in {".csv", ".png"})
    assert tables and set(tables) <= set(plots), "not declared as plots: " + ", ".join(
        sorted(set(tables) - set(plots))
    )
    assert "reports/api_grpo/rewards.csv" in plots


# ---------------------------------------------------------------- dvc exp show: a few numbers, readable

#: README's command: the params that differ between rows and the key figures (kept even when no row differs); no
#: Created column, no deps columns (paths: their md5 is text).
EXP_SHOW_ARGS = ["--only-changed", "--drop", "Created|.*/", "--keep", "[^.]*(@1|reward|coop)$"]
#: Every summary a stage writes: plain outputs (``cache: false``), never DVC metrics (text, ~1,000 columns).
SUMMARIES = [
    "reports/metrics.json",
    "reports/train/magrpo.json",
    "reports/orchestrator/summary.json",
    "reports/schemes.json",
    "reports/prepare.json",
    "reports/baselines.json",
    "reports/eval_base.json",
    "reports/api_grpo/summary.json",
]


def _metrics_files(spec: dict) -> list[str]:
    files = _entries(spec.get("metrics"))
    for stage in spec["stages"].values():
        files += _entries(stage.get("metrics"))
    return files


def test_the_key_figures_are_the_only_metric_and_every_summary_a_plain_output():
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    assert _metrics_files(spec) == ["reports/key_metrics.json"]
    assert _entries(spec["stages"]["evaluate"].get("metrics")) == ["reports/key_metrics.json"]
    outs = {f: s for s in spec["stages"].values() for f in _entries(s.get("outs"))}
    # committed with each experiment (cache: false): orchestry tune and orchestry seeds read them from git
    for f in SUMMARIES:
        assert f in outs, f"{f} is not a stage output"
        (entry,) = [
            o for s in spec["stages"].values() for o in s.get("outs") or [] if isinstance(o, dict) and f in o
        ]
        assert entry[f].get("cache") is False, f"{f}: cache: false (git keeps it with each experiment)"


def test_the_committed_key_figures_are_few_numbers_from_the_committed_metrics():
    import json

    from orchestry.analysis.metrics import KEY_METRICS, key_metrics

    metrics = json.loads((ROOT / "reports/metrics.json").read_text())
    key = json.loads((ROOT / "reports/key_metrics.json").read_text())
    assert key == key_metrics(metrics)
    assert list(key)[:4] == [c for c, _, _ in KEY_METRICS] == ["pass@1", "base@1", "reward", "coop"]
    assert list(key)[4:] == ["ext@1"]
    external = [m for name, m in metrics["transfer"].items() if name != "humaneval"]
    for column, method in (("ext@1", "magrpo"),):  # pooled by problems
        n = sum(m["methods"][method]["n_problems"] for m in external)
        pooled = (
            sum(m["methods"][method]["pass@1"] * m["methods"][method]["n_problems"] for m in external) / n
        )
        assert key[column] == pytest.approx(pooled)
    assert key["base@1"] == metrics["methods"]["base"]["pass@1"]
    assert key["coop"] == metrics["methods"]["magrpo"]["cooperation_rate"]
    assert all(isinstance(v, int | float) and not isinstance(v, bool) for v in key.values())
    assert all("." not in k for k in key) and len(key) == 5


def test_key_metrics_leaves_out_what_is_not_a_number():
    from orchestry.analysis.metrics import key_metrics

    report = {
        "methods": {"magrpo": {"pass@1": 0.5, "reward": "high", "cooperation_rate": float("nan")},
                    "base": {"pass@1": None, "reward": 0.1}},
        "transfer": {"humaneval": {"methods": {"magrpo": {"pass@1": 0.25}}}, "beginner": "not run"},
    }  # fmt: skip
    assert key_metrics(report) == {"pass@1": 0.5}  # HumanEval's pass@1 stays in metrics.json
    assert key_metrics({}) == {}
    two = {"transfer": {"a": {"methods": {"magrpo": {"pass@1": 0.5, "n_problems": 10}}},
                        "b": {"methods": {"magrpo": {"pass@1": 0.2, "n_problems": 30},
                                          "base": {"pass@1": 0.1, "n_problems": 30}}}}}  # fmt: skip
    assert key_metrics(two) == {"ext@1": pytest.approx((0.5 * 10 + 0.2 * 30) / 40)}


def _git_dvc_repo(root: Path, repro: bool) -> dict:
    """``git init``, ``dvc init``, ``dvc repro`` if ``repro``, and a first commit of what ``root`` holds; returns
    the env of its commands."""
    import subprocess

    from orchestry.smoke import clean_env

    env = {**clean_env(), "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    steps = [["git", "init", "-q", "-b", "main"], ["dvc", "init", "-q"], *([["dvc", "repro", "-q"]] if repro else []),
             ["git", "add", "-A"], ["git", "commit", "-qm", "b"]]  # fmt: skip
    for cmd in steps:
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True)
    return env


def _out(cmd: list[str], root: Path, env: dict, columns: int = 120) -> str:
    import subprocess

    cp = subprocess.run(cmd, cwd=root, env={**env, "COLUMNS": str(columns)}, capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    return cp.stdout


def test_the_real_dvc_yaml_declares_only_the_key_figures_as_metrics(tmp_path):
    """A git + DVC copy of dvc.yaml, params.yaml and every committed summary (as after ``make repro``): ``dvc
    metrics show`` has the key figures only, all numbers; ``dvc exp show --csv`` has them and then params and deps
    (before: 1,170 columns, ``reports/metrics.json``'s text among them: ``api_grpo.cache.path``)."""
    import json
    import shutil

    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    for f in ["dvc.yaml", "params.yaml", *_metrics_files(spec), *SUMMARIES]:
        if (ROOT / f).is_file():
            (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / f, tmp_path / f)
    env = _git_dvc_repo(tmp_path, repro=False)
    key = json.loads((ROOT / "reports/key_metrics.json").read_text())

    (files,) = [
        rev["data"] for rev in json.loads(_out(["dvc", "metrics", "show", "--json"], tmp_path, env)).values()
    ]
    assert list(files) == ["reports/key_metrics.json"]
    values = files["reports/key_metrics.json"]["data"]
    assert values == key and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in values.values()
    )
    header = _out(["dvc", "exp", "show", "--csv"], tmp_path, env).splitlines()[0].split(",")
    fixed = {"Experiment", "rev", "typ", "Created", "parent", "State", "Executor"}
    columns = [c for c in header if c not in fixed]
    assert columns[: len(key)] == list(key)
    # then params (section.key) and deps (paths: README's command drops them), no other metric
    assert all("." in c or "/" in c for c in columns[len(key) :])


#: A stand-in for ``evaluate``: the committed key figures, pass@1 and reward moved by the learning rate.
FAKE_EVALUATE = """
import json, yaml
lr = yaml.safe_load(open("params.yaml"))["train_magrpo"]["learning_rate"]
key = json.load(open("key.json"))
key.update({"pass@1": key["pass@1"] * (1 + lr), "reward": key["reward"] * (1 + lr)})
json.dump(key, open("reports/key_metrics.json", "w"))
"""


def test_readme_exp_show_fits_the_experiments_key_figures_and_changed_param_in_80_to_120_columns(tmp_path):
    """README's ``dvc exp show`` on two experiments of a learning-rate sweep (a stand-in evaluate stage with every
    stage's params of dvc.yaml and the committed key figures): 120 columns hold the experiment, pass@1, base@1,
    reward, coop, ext@1 and the changed param, nothing cut ("…"); 80 columns the experiment and the key
    figures (before: only "…" cells at 220 columns)."""
    import json
    import shutil

    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    params = sorted({_entries([p])[0] for s in spec["stages"].values() for p in s.get("params") or []})
    stage = {"cmd": "python evaluate.py", "deps": ["evaluate.py", "key.json"], "params": params,
             "metrics": [{"reports/key_metrics.json": {"cache": False}}]}  # fmt: skip
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"evaluate": stage}}, sort_keys=False))
    (tmp_path / "evaluate.py").write_text(FAKE_EVALUATE)
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    shutil.copy(ROOT / "reports/key_metrics.json", tmp_path / "key.json")
    (tmp_path / "reports").mkdir()
    env = _git_dvc_repo(tmp_path, repro=True)
    for lr in ("0.0003", "0.002"):
        _out(
            ["dvc", "exp", "run", "-q", "-n", f"lr-{lr}", "-S", f"train_magrpo.learning_rate={lr}"],
            tmp_path,
            env,
        )
    key = list(json.loads((ROOT / "reports/key_metrics.json").read_text()))
    exp_show = ["dvc", "exp", "show", "--no-pager", *EXP_SHOW_ARGS]

    table = _out(exp_show, tmp_path, env, columns=120)
    lines = table.splitlines()
    assert max(map(len, lines)) <= 120 and "…" not in table, table
    assert lines[1].split() == ["Experiment", *key, "train_magrpo.learning_rate"], table
    rows = [line.split() for line in lines[3:-1]]
    assert [r[0] for r in rows[:2]] == ["workspace", "main"] and len(rows) == 4, table
    assert {r[-1] for r in rows[2:]} == {"0.0003", "0.002"}, table  # each experiment's learning rate
    narrow = _out(exp_show, tmp_path, env, columns=80)
    assert max(map(len, narrow.splitlines())) <= 80, narrow
    assert narrow.splitlines()[1].split()[: 1 + len(key)] == ["Experiment", *key], narrow


def test_readme_shows_the_exp_show_command():
    readme = (ROOT / "README.md").read_text()
    assert "dvc exp show " + " ".join(shlex.quote(a) for a in EXP_SHOW_ARGS) in readme
