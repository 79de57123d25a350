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


def _open_when_ready(base: str, url: str, proc: Any, timeout_s: float, browser: bool) -> None:
    """Wait (at most ``timeout_s``) for the server at ``base`` to answer ``/health``, say so on stderr and, if
    ``browser``, open ``url`` in a web browser. Runs in a daemon thread: it never holds the command up."""
    import time
    import urllib.request
    import webbrowser

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    else:
        return
    typer.echo(f"MLflow UI ready: {url}", err=True)
    if browser:
        try:
            webbrowser.open(url, new=2)
        except Exception as e:  # a browser that fails to start must not stop the server
            typer.echo(f"could not open a browser ({e}); open the address above", err=True)


def ui(
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 5000,
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
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

    Prints the address of the experiment's runs table on stdout (MLflow 3's "Model training" mode with the
    columns stage, DVC experiment, git revision, execution and the key test metrics; orchestry.tracking.runs.
    runs_table_url) and, when a graphical browser exists, opens it once the server answers (never waiting for
    the browser). The command runs until the server stops: Ctrl-C or SIGTERM stops both. Exit code 2 when the
    store does not exist; otherwise the server's exit code.
    """
    import os
    import signal
    import subprocess
    import threading

    from orchestry.evaluation.scoring import FileOptionError
    from orchestry.runtime import repo_root
    from orchestry.tracking.runs import runs_table_url, set_runs_view, ui_base
    from orchestry.tracking.runs import tracking_uri as default_uri

    with _errors(debug, (FileOptionError, "")):
        uri = tracking_uri or default_uri()
        if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
            raise FileOptionError("tracking-uri", f"no MLflow store at {uri.removeprefix('sqlite:///')} "
                                  "(run the pipeline first, or pass --tracking-uri)")  # fmt: skip
        import mlflow

        client = mlflow.MlflowClient(uri)
        exp = client.get_experiment_by_name(experiment)
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
               "--host", host, "--port", str(port)]  # fmt: skip
        typer.echo(url)
        typer.echo(f"MLflow UI starting on {base} ({uri}); Ctrl-C stops it", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        # its own process group: the server's workers (uvicorn) are stopped with it, whoever signals this command
        proc = subprocess.Popen(cmd, start_new_session=True)
    opener = threading.Thread(
        target=_open_when_ready,
        args=(base, url, proc, 300.0, browser and _can_open_browser()),
        daemon=True,
    )
    opener.start()

    def stop_server(*_: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, stop_server)
    try:
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
