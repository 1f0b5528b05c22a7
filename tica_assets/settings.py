"""Where the code location finds its inputs and writes its outputs: one helper, read from the
environment once, so no asset or sensor reads `os.environ` itself.

| variable | default | meaning |
| --- | --- | --- |
| TICA_CANDIDATES_DIR | demo/candidates | folder of candidate manifests, one YAML file per track |
| TICA_QUESTIONS_DIR | demo/questions | frozen questions: `<dir>/<track>/*.yaml` first, then `<dir>/*.yaml` |
| TICA_LEDGER | data/ledger.duckdb | the ledger: a DuckDB file, or a `postgresql://` address (tica/ledger/postgres_store.py) |
| TICA_DATA_DIR | data | legs written by the CPU runner, plots, fingerprint cache |
| TICA_REPLAY | (none) | `track=folder[,track=folder]`: tracks whose legs replay committed sealed receipts (a folder, or a .tar.xz/.tgz of one); `*=folder` for every track |
| TICA_RECEIPTS_CACHE | ~/.cache/tica/receipts | where a replayed archive of receipts is unpacked, once per archive digest |
| TICA_TRUSTED_KEYS | (none) | folder of Ed25519 public keys (PEM) whose signed ledger chains, carried with replayed receipts in `frozen/`, may show a question frozen before the run (tica/order_proof.py) |
| TICA_GPU_TRACKS | (none) | `track[,track]` or `*`: tracks whose legs run on this machine's GPUs (LocalGpuLegRunner: the H200 producers through Dagster Pipes, one GPU pool); replay wins where both name a track |
| TICA_AUTORUN_TRACKS | (none) | `track[,track]` or `*`: tracks whose evidence re-materializes by itself when a component changes |
| TICA_SENSOR_INTERVAL_S | 15 | manifest sensor interval |

Relative paths resolve against the project root (the folder holding `workspace.yaml`), not the
process's working directory: `dagster dev`, its daemon and its code servers agree on them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _path(value: str | None, default: str) -> Path:
    p = Path(value or default).expanduser()
    return p if p.is_absolute() else (PROJECT_ROOT / p)


def _ledger_target(value: str | None, default: str) -> Path | str:
    """A DuckDB file (a path, resolved as the others) or a postgresql:// address (kept as text)."""
    from tica.ledger import is_postgres

    return value if value and is_postgres(value) else _path(value, default)


def _mapping(value: str | None, var: str) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for part in (value or "").split(","):
        part = part.strip()
        if not part:
            continue
        track, sep, folder = part.partition("=")
        if not sep or not track.strip() or not folder.strip():
            raise ValueError(f"{var}: {part!r} is not track=folder")
        out[track.strip()] = _path(folder.strip(), folder.strip())
    return out


def _tracks(value: str | None) -> frozenset[str]:
    return frozenset(t.strip() for t in (value or "").split(",") if t.strip())


@dataclass(frozen=True)
class Settings:
    candidates_dir: Path
    questions_dir: Path
    ledger_path: Path | str  # a DuckDB file, or a postgresql:// address
    data_dir: Path
    replay: dict[str, Path] = field(default_factory=dict)
    autorun: frozenset[str] = frozenset()
    gpu: frozenset[str] = frozenset()
    sensor_interval_s: int = 15

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Settings":
        env = dict(os.environ if env is None else env)
        return cls(
            candidates_dir=_path(env.get("TICA_CANDIDATES_DIR"), "demo/candidates"),
            questions_dir=_path(env.get("TICA_QUESTIONS_DIR"), "demo/questions"),
            ledger_path=_ledger_target(env.get("TICA_LEDGER"), "data/ledger.duckdb"),
            data_dir=_path(env.get("TICA_DATA_DIR"), "data"),
            replay=_mapping(env.get("TICA_REPLAY"), "TICA_REPLAY"),
            autorun=_tracks(env.get("TICA_AUTORUN_TRACKS")),
            gpu=_tracks(env.get("TICA_GPU_TRACKS")),
            sensor_interval_s=int(env.get("TICA_SENSOR_INTERVAL_S", "15")),
        )

    @property
    def legs_dir(self) -> Path:
        return self.data_dir / "legs"

    @property
    def plots_dir(self) -> Path:
        return self.data_dir / "plots"

    @property
    def fingerprint_cache(self) -> Path:
        return self.data_dir / "cache" / "fingerprints.json"

    def replay_folder(self, track: str) -> Path | None:
        return self.replay.get(track) or self.replay.get("*")

    def on_local_gpus(self, track: str) -> bool:
        return self.replay_folder(track) is None and (track in self.gpu or "*" in self.gpu)

    def own_runner(self, track: str) -> bool:
        """The track's legs go to a runner of its own (replay or local GPUs), not the shared CPU one."""
        return self.replay_folder(track) is not None or self.on_local_gpus(track)

    def autoruns(self, track: str) -> bool:
        return track in self.autorun or "*" in self.autorun
