"""The main job on the embedded default: build the demo model, observe every track's candidate,
materialize every track's evidence and report into a kept Dagster instance, print the report.

    .venv/bin/python -m tica_assets.demo            # what scripts/demo.sh runs before `dagster dev`

The CPU track's legs really run (vLLM's CPU build, the trainer forward, `vllm bench serve`);
the H200 track replays the sealed receipts that came back from the lent H200. Everything lands
in the DuckDB ledger (TICA_LEDGER) and the instance (DAGSTER_HOME), so the UI opened afterwards
shows the same materializations, checks and staleness.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from tica_assets.settings import PROJECT_ROOT

DEFAULT_ENV = {
    "DAGSTER_HOME": "data/dagster",
    "TICA_LEDGER": "data/ledger.duckdb",
    "TICA_DATA_DIR": "data",
    "TICA_REPLAY": "h200-mid4=tests/fixtures/h200,h200-mid4-tp2=tests/fixtures/h200/run5,h200-tput=tests/fixtures/h200/basis.tar.xz,h200-smollm2=tests/fixtures/h200/basis.tar.xz,h200-accept=tests/fixtures/h200/accept.tar.xz,h200-accept-stock=tests/fixtures/h200/accept.tar.xz",
    "TICA_RECEIPTS_CACHE": "data/receipts",  # where archived receipts (basis.tar.xz) are unpacked
    "TICA_TRUSTED_KEYS": "demo/trusted-keys",  # keys of the signed freeze chains replayed receipts carry (frozen/)
}
QUIET_CONSOLE = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}
DEMO_MODELS = {"tiny": "tiny-llama", "smollm2": "smollm2-135m-instruct"}


def demo_env() -> dict[str, str]:
    """The embedded default, unless the caller set a variable already."""
    from tica.ledger import is_postgres

    env = {}
    for key, value in DEFAULT_ENV.items():
        v = os.environ.get(key, value)
        as_is = key == "TICA_REPLAY" or os.path.isabs(v) or is_postgres(v)
        env[key] = v if as_is else str(PROJECT_ROOT / v)
    return env


def warnings_to_file(path: Path) -> None:
    """Python warnings of this process (Dagster's beta and preview notices, torch's) are not the
    user's business: they go to a file, as each leg's own output goes to its `<leg>.log`."""
    import warnings

    path.parent.mkdir(parents=True, exist_ok=True)
    stream = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the life of the process

    def show(message, category, filename, lineno, file=None, line=None):
        stream.write(warnings.formatwarning(message, category, filename, lineno, line))
        stream.flush()

    warnings.showwarning = show


def prepare_models(data_dir: Path, models: list[str]) -> None:
    from tica.legs.runner import prepare_model

    for name in models:
        t0 = time.time()
        path = prepare_model(name, data_dir / "models")
        print(f"[demo] model {name}: {_shown(path)} ({time.time() - t0:.0f} s)", flush=True)


def observe_manifests(defs, instance) -> None:
    """One tick of the manifest sensor, applied as the daemon would: the components' data versions."""
    from dagster import build_sensor_context

    from sensors.manifests import SENSOR_NAME

    sensor = defs.resolve_sensor_def(SENSOR_NAME)
    tick = sensor.evaluate_tick(
        build_sensor_context(instance=instance, resources={"ledger": defs.resources["ledger"]}, sensor_name=SENSOR_NAME)
    )
    for event in tick.asset_events:
        instance.report_runless_asset_event(event)
    print(f"[demo] manifest sensor: {len(tick.asset_events)} component observation(s)", flush=True)


def materialize_tracks(defs, instance, tracks, wanted: set[str] | None) -> list[str]:
    """Run each wanted track's evidence job; the names of the tracks whose run did not succeed."""
    from tica_assets.keys import safe_name

    failed = []
    for track in tracks:
        if wanted is not None and track.name not in wanted:
            continue
        t0 = time.time()
        print(f"[demo] {track.name}: materializing every evidence item, its checks and the report", flush=True)
        # Dagster's own step events (DEBUG) stay in the run's event log, shown in the UI; the
        # console gets the legs' progress and what went wrong.
        result = defs.resolve_job_def(f"{safe_name(track.name)}_evidence").execute_in_process(
            instance=instance, raise_on_error=False, run_config=QUIET_CONSOLE
        )
        print(f"[demo] {track.name}: run {result.run_id} {'succeeded' if result.success else 'FAILED'} "
              f"in {time.time() - t0:.0f} s", flush=True)
        if not result.success:
            failed.append(track.name)
    return failed


def materialize_matrix(defs, instance, wanted: set[str] | None) -> list[str]:
    """Replay the committed matrix receipt sets (tica_assets/matrix.py), where the graph has them;
    ["h200-matrix"] when that run did not succeed."""
    from dagster import DagsterInvariantViolationError

    from tica_assets.matrix import MATRIX_JOB, MATRIX_TRACK

    if wanted is not None and MATRIX_TRACK not in wanted:
        return []
    try:
        job = defs.resolve_job_def(MATRIX_JOB)
    except DagsterInvariantViolationError:  # no matrix question in this project's questions folder
        return []
    t0 = time.time()
    print(f"[demo] {MATRIX_TRACK}: replaying the committed matrix receipts through the matrix judge", flush=True)
    result = job.execute_in_process(instance=instance, raise_on_error=False, run_config=QUIET_CONSOLE)
    print(f"[demo] {MATRIX_TRACK}: run {result.run_id} {'succeeded' if result.success else 'FAILED'} "
          f"in {time.time() - t0:.0f} s", flush=True)
    return [] if result.success else [MATRIX_TRACK]


def track_reports(settings, tracks) -> list:
    """Each track's acceptance report, as the report asset reads it: the candidate its manifest
    names now and the questions it asks now."""
    from tica.acceptance import report
    from tica.cli.report import questions_in_force
    from tica.errors import ManifestError
    from tica.ledger import open_ledger
    from tica_assets.candidates import load_track

    ledger = open_ledger(str(settings.ledger_path))
    out = []
    for track in tracks:
        try:
            loaded, current = load_track(track, settings)
            conditions = loaded.manifest.description
        except ManifestError:
            current, conditions = None, ""
        out.append(report(ledger, track.name, current, conditions,
                          questions=questions_in_force(settings.questions_dir, track.name)))
    return out


def print_report(settings, home: Path, tracks) -> None:
    """The answer per track (its first line, then one row per item), and the same as one page."""
    from tica.cli.report import report_text
    from tica.report_html import render

    reports = track_reports(settings, tracks)
    for rep in reports:
        print("\n" + report_text(rep), flush=True)
    page = Path(settings.data_dir) / "report.html"
    page.write_text(render(reports, generated_by="scripts/demo.sh"), encoding="utf-8")
    print(f"\n[demo] the answers: {', '.join(r.headline.split(' — ')[0] for r in reports)}", flush=True)
    print(f"[demo] report page: {_shown(page)}   ledger: {_shown(settings.ledger_path)}   Dagster home: {_shown(home)}",
          flush=True)
    print(f"[demo] warnings: {_shown(Path(settings.data_dir) / 'warnings.log')}   each leg's own output: "
          f"<leg>.log beside it under {_shown(settings.legs_dir)}", flush=True)


def _shown(path) -> str:
    """A path as the user gave it: relative to the project where it lies inside."""
    try:
        return str(Path(path).resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        return str(path)


def exit_code(failed: list[str]) -> int:
    """0 only when every run succeeded: a failed Dagster run fails the demo (scripts/demo.sh)."""
    if failed:
        print(f"[demo] runs that did not succeed (see the UI's run page): {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tracks", default="*", help="comma-separated tracks to materialize (default: all)")
    parser.add_argument("--models", default="tiny", help="demo models to build first: tiny, smollm2")
    args = parser.parse_args(argv)

    env = demo_env()
    os.environ.update(env)
    home = Path(env["DAGSTER_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    warnings_to_file(Path(env["TICA_DATA_DIR"]) / "warnings.log")
    prepare_models(Path(env["TICA_DATA_DIR"]), [m for m in args.models.split(",") if m])

    # Imported after the environment is set: the definitions read it once.
    from dagster import DagsterInstance

    from tica_assets.definitions import build_defs
    from tica_assets.settings import Settings
    from tica_assets.tracks import discover_tracks

    settings = Settings.from_env()
    defs = build_defs(settings)
    instance = DagsterInstance.get()
    observe_manifests(defs, instance)
    wanted = None if args.tracks == "*" else set(args.tracks.split(","))
    tracks = discover_tracks(settings.candidates_dir)
    failed = materialize_tracks(defs, instance, tracks, wanted) + materialize_matrix(defs, instance, wanted)
    print_report(settings, home, [t for t in tracks if wanted is None or t.name in wanted])
    return exit_code(failed)


if __name__ == "__main__":
    raise SystemExit(main())
