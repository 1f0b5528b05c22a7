"""Every `TICA_*` variable the product reads, in one pydantic-settings model: docs/settings.md is its
table (type, default, meaning), and tests/core/test_settings.py keeps the two equal and checks that
no other module reads a `TICA_*` variable itself.

Values are read from the environment at call time, never cached, so a test that sets a variable
sees it. `settings()` reads every variable; `setting(name)` reads one, so a bad value of one
variable fails only the work that reads it (as each module's own read did before). A bad value is a
`SettingsError` naming its variable. Paths are kept as written: `project_path` resolves a relative
one against the project root, as the Dagster code location does.

The leg-side variables (those a producer reads on a GPU node) are parsed by tica.leg_settings,
standard library only, which producers read directly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict

from tica import leg_settings as leg
from tica.errors import InputError

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the folder holding workspace.yaml

LegRunner = Literal["cpu", "ray"]


class SettingsError(InputError, ValueError):
    """A variable whose value cannot be read: "TICA_X: <env>: what is wrong"."""

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(variable, "<env>", message)


def project_path(path: Path | str) -> Path:
    """`path` with ~ expanded, relative to the project root unless absolute."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else PROJECT_ROOT / p


# ---------------------------------------------------------------- parsers (text, None when unset)


def _text(default: str) -> Callable[[str | None], str]:
    return lambda raw: raw or default


def _optional_path(raw: str | None) -> Path | None:
    return Path(raw) if raw else None


def _tracks(raw: str | None) -> frozenset[str]:
    return frozenset(t.strip() for t in (raw or "").split(",") if t.strip())


def _replay(raw: str | None) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for part in (raw or "").split(","):
        part = part.strip()
        if not part:
            continue
        track, sep, folder = part.partition("=")
        if not sep or not track.strip() or not folder.strip():
            raise ValueError(f"{part!r} is not track=folder")
        out[track.strip()] = Path(folder.strip())
    return out


def _receipts_cache(raw: str | None) -> Path:
    return Path(raw) if raw else Path.home() / ".cache" / "tica" / "receipts"


def _sensor_interval(raw: str | None) -> int:
    try:
        return int(raw) if raw else 15
    except ValueError:
        raise ValueError(f"{raw!r} is not a whole number of seconds") from None


def _workers(raw: str | None) -> int | None:
    env = (raw or "").strip()
    if not env:
        return None
    try:
        return max(1, int(env))
    except ValueError:
        raise ValueError(f"{env!r} is not a number of processes") from None


def _switch(default: bool | None) -> Callable[[str | None], bool | None]:
    def parse(raw: str | None) -> bool | None:
        env = (raw or "").strip()
        if not env:
            return default
        if env in ("0", "1"):
            return env == "1"
        raise ValueError(f"{env!r} is not 0 or 1")

    return parse


def _leg_runner(raw: str | None) -> str:
    env = (raw or "").strip() or "cpu"
    if env not in ("cpu", "ray"):
        raise ValueError(f"{env!r} is not cpu or ray")
    return env


def _optional_text(raw: str | None) -> str | None:
    return raw.strip() or None if raw else None


def _var(name: str, parse: Callable[[str | None], Any], meaning: str) -> Any:
    """A field read from the variable `name`; `parse` maps its text (None when unset) to the value,
    the default included, so the default is what `parse(None)` gives."""
    del parse  # the field's annotation carries it (_parsed); named here for the reader
    return Field(None, validation_alias=name, validate_default=True, description=meaning)


def _parsed(parse: Callable[[str | None], Any]) -> BeforeValidator:
    return BeforeValidator(lambda v: parse(v) if v is None or isinstance(v, str) else v)


class _Base(BaseSettings):
    # enable_decoding off: a dict, set or tuple field gets its variable's text (our parsers), not JSON
    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", frozen=True, enable_decoding=False)


class TicaSettings(_Base):

    # where the inputs are and the ledger goes
    ledger: Annotated[str, _parsed(_text("data/ledger.duckdb"))] = _var(
        "TICA_LEDGER", _text("data/ledger.duckdb"),
        "the ledger: a DuckDB file, or a postgresql:// address")
    candidates_dir: Annotated[Path, _parsed(_text("demo/candidates"))] = _var(
        "TICA_CANDIDATES_DIR", _text("demo/candidates"), "folder of candidate manifests, one YAML file per track")
    questions_dir: Annotated[Path, _parsed(_text("demo/questions"))] = _var(
        "TICA_QUESTIONS_DIR", _text("demo/questions"), "frozen questions")
    data_dir: Annotated[Path, _parsed(_text("data"))] = _var(
        "TICA_DATA_DIR", _text("data"), "legs written by the CPU runner, plots, fingerprint cache")
    # which runner makes a track's legs
    replay: Annotated[dict[str, Path], _parsed(_replay)] = _var(
        "TICA_REPLAY", _replay, "tracks whose legs replay committed sealed receipts")
    gpu_tracks: Annotated[frozenset[str], _parsed(_tracks)] = _var(
        "TICA_GPU_TRACKS", _tracks, "tracks whose legs run on this machine's GPUs")
    leg_runner: Annotated[LegRunner, _parsed(_leg_runner)] = _var(
        "TICA_LEG_RUNNER", _leg_runner, "the runner of every track that neither replays nor runs on local GPUs")
    ray_address: Annotated[str | None, _parsed(_optional_text)] = _var(
        "TICA_RAY_ADDRESS", _optional_text, "the Ray dashboard's HTTP address, for TICA_LEG_RUNNER=ray")
    ray_shared_dir: Annotated[str | None, _parsed(_optional_text)] = _var(
        "TICA_RAY_SHARED_DIR", _optional_text, "a folder every Ray node sees, for TICA_LEG_RUNNER=ray")
    autorun_tracks: Annotated[frozenset[str], _parsed(_tracks)] = _var(
        "TICA_AUTORUN_TRACKS", _tracks, "tracks whose evidence re-materializes by itself")
    sensor_interval_s: Annotated[int, _parsed(_sensor_interval)] = _var(
        "TICA_SENSOR_INTERVAL_S", _sensor_interval, "manifest sensor interval")
    receipts_cache: Annotated[Path, _parsed(_receipts_cache)] = _var(
        "TICA_RECEIPTS_CACHE", _receipts_cache, "where a replayed archive of receipts is unpacked")
    trusted_keys: Annotated[Path | None, _parsed(_optional_path)] = _var(
        "TICA_TRUSTED_KEYS", _optional_path, "folder of Ed25519 public keys trusted to sign a freeze")
    # verifying the ledger
    verify_workers: Annotated[int | None, _parsed(_workers)] = _var(
        "TICA_VERIFY_WORKERS", _workers, "processes verify uses")
    verify_batches: Annotated[bool, _parsed(_switch(True))] = _var(
        "TICA_VERIFY_BATCHES", _switch(True), "verify reads the chain in batches first")
    verify_in_db: Annotated[bool | None, _parsed(_switch(None))] = _var(
        "TICA_VERIFY_IN_DB", _switch(None), "verify hashes in the database first")
    # read by leg producers too (tica.leg_settings, standard library only)
    cache_dir: Annotated[Path, _parsed(leg.parse_cache_dir)] = _var(
        leg.CACHE_DIR, leg.parse_cache_dir, "fingerprint cache folder")
    progress: Annotated[bool | None, _parsed(leg.parse_progress)] = _var(
        leg.PROGRESS, leg.parse_progress, "progress on stderr forced on or off")
    image_digest: Annotated[str | None, _parsed(leg.parse_image_digest)] = _var(
        leg.IMAGE_DIGEST, leg.parse_image_digest, "the image a leg runs in")
    n_steps: Annotated[int, _parsed(leg.parse_n_steps)] = _var(
        leg.N_STEPS, leg.parse_n_steps, "forward steps before and after the update")
    overlay_parts: Annotated[tuple[str, ...] | None, _parsed(leg.parse_overlay_parts)] = _var(
        leg.OVERLAY_PARTS, leg.parse_overlay_parts, "the vLLM overlay parts to apply")
    allow_vllm_version: Annotated[bool, _parsed(leg.parse_allow_vllm_version)] = _var(
        leg.ALLOW_VLLM_VERSION, leg.parse_allow_vllm_version, "try an unpinned vLLM")
    smollm2_gguf: Annotated[Path | None, _parsed(leg.parse_smollm2_gguf)] = _var(
        leg.SMOLLM2_GGUF, leg.parse_smollm2_gguf, "SmolLM2's GGUF file")


def variables() -> dict[str, str]:
    """Every variable the model reads, to its field's name."""
    return {str(f.validation_alias): name for name, f in TicaSettings.model_fields.items()}


@functools.cache
def _model(fields: frozenset[str]) -> type[BaseSettings]:
    """A model of `fields` alone: only their variables are read and checked."""
    if fields == frozenset(TicaSettings.model_fields):
        return TicaSettings
    unknown = fields - set(TicaSettings.model_fields)
    if unknown:
        raise KeyError(f"no setting named {sorted(unknown)}")
    chosen: dict[str, Any] = {n: (f.rebuild_annotation(), f) for n, f in TicaSettings.model_fields.items()
                              if n in fields}
    return create_model("TicaSettingsPart", __base__=_Base, **chosen)  # type: ignore[call-overload]


def _error(exc: ValidationError, model: type[BaseSettings]) -> SettingsError:
    err = exc.errors()[0]
    loc = str(err["loc"][0]) if err["loc"] else ""
    by_field = {n: str(f.validation_alias) for n, f in model.model_fields.items()}
    variable = by_field.get(loc, loc)
    cause = (err.get("ctx") or {}).get("error")
    return SettingsError(variable, str(cause) if cause is not None else err["msg"])


def settings(env: Mapping[str, str] | None = None) -> TicaSettings:
    """Every setting from `env` (default: this process's environment, read now); a bad value of
    any variable raises SettingsError."""
    out: TicaSettings = _read(env, frozenset(TicaSettings.model_fields))
    return out


def _read(env: Mapping[str, str] | None, fields: frozenset[str]) -> Any:
    model = _model(fields)
    try:
        if env is None:
            return model()
        names = {str(f.validation_alias) for f in model.model_fields.values()}
        return model.model_validate({k: v for k, v in env.items() if k in names})
    except ValidationError as exc:
        raise _error(exc, model) from None


def setting(name: str, env: Mapping[str, str] | None = None) -> Any:
    """One setting's value, only its variable read and checked."""
    return getattr(_read(env, frozenset((name,))), name)


def settings_of(names: Iterable[str], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Some settings by name, only their variables read and checked."""
    part = _read(env, frozenset(names))
    return {n: getattr(part, n) for n in names}
