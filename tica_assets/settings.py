"""Where the code location finds its inputs and writes its outputs, and which runner makes each
track's legs: read from the environment once, through the core's settings model (tica/settings.py),
so no asset or sensor reads `os.environ` itself. The variables: docs/settings.md.

Relative paths resolve against the project root (the folder holding `workspace.yaml`), not the
process's working directory: `dagster dev`, its daemon and its code servers agree on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tica.settings import PROJECT_ROOT, SettingsError, project_path, settings_of

__all__ = ["PROJECT_ROOT", "Settings"]

FIELDS = ("ledger", "candidates_dir", "questions_dir", "data_dir", "replay", "autorun_tracks", "gpu_tracks",
          "sensor_interval_s", "leg_runner", "ray_address", "ray_shared_dir")


def _ledger_target(value: str) -> Path | str:
    """A DuckDB file (a path, resolved as the others) or a postgresql:// address (kept as text)."""
    from tica.ledger import is_postgres

    return value if is_postgres(value) else project_path(value)


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
    leg_runner: str = "cpu"  # the shared runner: "cpu" (CpuLegRunner) or "ray" (RayLegRunner)
    ray_address: str | None = None
    ray_shared_dir: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Settings":
        s: dict[str, Any] = settings_of(FIELDS, env)
        if s["leg_runner"] == "ray":
            for name, var in (("ray_address", "TICA_RAY_ADDRESS"), ("ray_shared_dir", "TICA_RAY_SHARED_DIR")):
                if not s[name]:
                    raise SettingsError(var, "is unset, and TICA_LEG_RUNNER=ray needs it")
        return cls(
            candidates_dir=project_path(s["candidates_dir"]),
            questions_dir=project_path(s["questions_dir"]),
            ledger_path=_ledger_target(s["ledger"]),
            data_dir=project_path(s["data_dir"]),
            replay={track: project_path(folder) for track, folder in s["replay"].items()},
            autorun=s["autorun_tracks"],
            gpu=s["gpu_tracks"],
            sensor_interval_s=s["sensor_interval_s"],
            leg_runner=s["leg_runner"],
            ray_address=s["ray_address"],
            ray_shared_dir=s["ray_shared_dir"],
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
