"""``orchestry ui``: the MLflow UI on the project's store."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestry.cli.common import (
    Debug,
    TrackingUri,
    _errors,
)


def _can_open_browser() -> bool:
    """A graphical web browser can be opened without taking the terminal: ``BROWSER`` is set (the user's
    choice), or macOS/Windows, or a Linux/BSD graphical session (``DISPLAY`` or ``WAYLAND_DISPLAY``). Python's
    ``webbrowser`` would otherwise fall back to a text browser (lynx, w3m) in this terminal."""
    import os

    if os.environ.get("BROWSER"):
        return True
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _answers(base: str) -> bool:
    """The server at ``base`` answers ``/health`` with 200."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _wait_until_ready(base: str, proc: Any, timeout_s: float) -> bool:
    """Poll ``base``'s ``/health`` every half second until it answers (True), the server process exits or
    ``timeout_s`` passes (False)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if _answers(base):
            return True
        time.sleep(0.5)
    return False


def _open_browser(url: str) -> None:
    """Open ``url`` in a web browser; runs in a daemon thread, so a slow browser never holds the command up."""
    import webbrowser

    try:
        webbrowser.open(url, new=2)
    except Exception as e:  # a browser that fails to start must not stop the server
        typer.echo(f"could not open a browser ({e}); open the address above", err=True)


def _ui_address_default() -> tuple[str | None, int | None]:
    """Host and port of ``$MLFLOW_UI_URL`` (the address the report links to; README "MLflow"), or Nones."""
    import os
    from urllib.parse import urlsplit

    from orchestry.reporting.report import UI_URL_ENV

    value = (os.environ.get(UI_URL_ENV) or "").strip()
    if not value:
        return None, None
    parts = urlsplit(value)
    return parts.hostname, parts.port


def ui(
    port: Annotated[
        int | None,
        typer.Option(min=1, max=65535, help="Port to listen on [default: MLFLOW_UI_URL's port, else 5000]."),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(
            help="Address to listen on (0.0.0.0: every interface) [default: MLFLOW_UI_URL's host, else "
            "127.0.0.1]."
        ),
    ] = None,
    workers: Annotated[
        int, typer.Option(min=1, max=64, help="Server worker processes (mlflow server --workers).")
    ] = 1,
    jobs: Annotated[
        bool,
        typer.Option(
            "--jobs/--no-jobs",
            help="Start MLflow's background job runner (GenAI evaluation jobs; several ~240 MB processes).",
        ),
    ] = False,
    tracking_uri: TrackingUri = None,
    experiment: Annotated[
        str, typer.Option(help="MLflow experiment whose runs table is opened.")
    ] = "orchestry",
    browser: Annotated[
        bool,
        typer.Option(
            "--browser/--no-browser",
            help="Open the runs table in a web browser once the server answers (only in a graphical session "
            "or with BROWSER set).",
        ),
    ] = True,
    debug: Debug = False,
) -> None:
    """Start the MLflow UI (mlflow server) on the project's store; artifacts from <repo root>/mlartifacts.

    Once the server answers (polled every half second), prints the address of the experiment's runs table on
    stdout (MLflow 3's "Model training" mode with the columns stage, DVC experiment, git revision, execution and
    the key test metrics; orchestry.tracking.ui.runs_table_url), then "ready", and, when a graphical browser
    exists, opens it (never waiting for the browser). The server runs one worker and no background job runner
    unless asked (--workers, --jobs): light on a 2-core laptop. Host and port default to those of MLFLOW_UI_URL,
    the address the report's MLflow links use. The command runs until the server stops: Ctrl-C or SIGTERM stops
    both. Exit code 2 when the store does not exist; otherwise the server's exit code.
    """
    import os
    import signal
    import subprocess
    import threading

    from orchestry.evaluation.scoring import FileOptionError
    from orchestry.paths import repo_root
    from orchestry.tracking.runs import tracking_uri as default_uri
    from orchestry.tracking.ui import runs_table_url, set_runs_view, ui_base

    with _errors(debug, (FileOptionError, "")):
        uri = tracking_uri or default_uri()
        if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
            raise FileOptionError("tracking-uri", f"no MLflow store at {uri.removeprefix('sqlite:///')} "
                                  "(run the pipeline first, or pass --tracking-uri)")  # fmt: skip
        import mlflow

        client = mlflow.MlflowClient(uri)
        exp = client.get_experiment_by_name(experiment)
        env_host, env_port = _ui_address_default()
        host, port = host or env_host or "127.0.0.1", port or env_port or 5000
        base = ui_base(host, port)
        if exp is None:
            url = f"{base}/#/experiments"
            typer.echo(f"no MLflow experiment {experiment!r} in {uri}: opening the experiment list", err=True)
        else:
            set_runs_view(client, exp.experiment_id)  # stores made before the view existed get it too
            url = runs_table_url(exp.experiment_id, base)
        artifacts = repo_root() / "mlartifacts"
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
               "--default-artifact-root", artifacts.as_uri(), "--artifacts-destination", str(artifacts),
               "--host", host, "--port", str(port), "--workers", str(workers)]  # fmt: skip
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "true" if jobs else "false"}
        typer.echo(f"MLflow UI starting on {base} ({uri}); Ctrl-C stops it", err=True)
        sys.stderr.flush()
        # its own process group: the server's workers (uvicorn) are stopped with it, whoever signals this command;
        # its output goes to stderr, so stdout carries only the address and "ready"
        proc = subprocess.Popen(cmd, start_new_session=True, env=env, stdout=2)

    def stop_server(*_: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, stop_server)
    try:
        try:
            if _wait_until_ready(base, proc, 300.0):
                typer.echo(url)  # only now: the address answers when the user opens it
                typer.echo("ready (Ctrl-C stops the server)")
                sys.stdout.flush()
                if browser and _can_open_browser():
                    threading.Thread(target=_open_browser, args=(url,), daemon=True).start()
            elif proc.poll() is None:
                typer.echo(
                    f"the MLflow server does not answer {base}/health after 300 s; still waiting", err=True
                )
        except KeyboardInterrupt:
            stop_server()
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:  # Ctrl-C: stop the server (another process group), then wait for it
                stop_server()
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop_server()  # workers left behind by a server that exited on its own
    raise typer.Exit(0 if code in (0, -signal.SIGTERM, -signal.SIGINT) else code)
