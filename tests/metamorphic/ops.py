"""Receipt edits for the metamorphic suite: every edit reseals the leg it touched
(`tica.seal.seal_leg`), as an honest-looking producer would have sealed the result."""

from __future__ import annotations

import copy
import datetime as _dt
import io
import json
import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tests.bound_receipts import set_dotted  # noqa: F401 (re-exported for the catalogue)
from tica import canaries as cn
from tica.metrics import forward_metrics, step_content_digest
from tica.seal import SEAL_FILE, seal_leg

LEG = "leg.json"
BENCH_DATE = "%Y%m%d-%H%M%S"

# ---------------------------------------------------------------------------- plain files


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def dump(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1))


def meta(leg: Path) -> dict[str, Any]:
    return load(leg / LEG)


def edit_json(path: Path, fn: Callable[[Any], Any], leg: Path) -> None:
    """fn edits the parsed JSON in place (what it returns is ignored); the leg is resealed."""
    data = load(path)
    fn(data)
    dump(path, data)
    seal_leg(leg)


def edit_meta(leg: Path, fn: Callable[[dict[str, Any]], Any]) -> None:
    edit_json(leg / LEG, fn, leg)


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_rows(path: Path, rows: Iterable[dict[str, Any]], leg: Path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    seal_leg(leg)


def edit_rows(path: Path, fn: Callable[[list[dict[str, Any]]], Any], leg: Path) -> None:
    rows = read_rows(path)
    new = fn(rows)
    replaced = isinstance(new, list) and all(isinstance(r, dict) for r in new)
    write_rows(path, new if replaced else rows, leg)


def load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def save_npz(path: Path, data: dict[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    np.savez(buf, **data)
    path.write_bytes(buf.getvalue())


def leg_files(leg: Path) -> list[Path]:
    """Every file of a leg but its own seal."""
    return sorted(p for p in leg.rglob("*") if p.is_file() and p.relative_to(leg).as_posix() != SEAL_FILE)


def leg_of(legs: Sequence[Path], **want: Any) -> Path:
    for leg in legs:
        m = meta(leg)
        if all(m.get(k) == v for k, v in want.items()):
            return leg
    raise LookupError(want)


def legs_where(legs: Sequence[Path], **want: Any) -> list[Path]:
    return [leg for leg in legs if all(meta(leg).get(k) == v for k, v in want.items())]


# ---------------------------------------------------------------------------- dotted keys

_MISSING = object()


def get_dotted(data: Any, dotted: str, default: Any = _MISSING) -> Any:
    node = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            if default is _MISSING:
                raise KeyError(dotted)
            return default
        node = node[part]
    return node



def del_dotted(data: dict[str, Any], dotted: str) -> bool:
    node: Any = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    if isinstance(node, dict) and parts[-1] in node:
        del node[parts[-1]]
        return True
    return False


def string_leaves(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, value) of every string leaf under a JSON object (lists are not entered)."""
    out: list[tuple[str, str]] = []
    if isinstance(data, dict):
        for k, v in data.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, str):
                out.append((key, v))
            elif isinstance(v, dict):
                out += string_leaves(v, key)
    return out


# ---------------------------------------------------------------------------- times


def parse_time(text: str) -> _dt.datetime:
    return _dt.datetime.fromisoformat(text)


def shift_times(m: dict[str, Any], delta: _dt.timedelta) -> None:
    for key in ("started_at", "ended_at"):
        if isinstance(m.get(key), str):
            m[key] = (parse_time(m[key]) + delta).isoformat()


def shift_bench_date(bench: dict[str, Any], delta: _dt.timedelta) -> None:
    if isinstance(bench.get("date"), str):
        bench["date"] = (_dt.datetime.strptime(bench["date"], BENCH_DATE) + delta).strftime(BENCH_DATE)


def respell_time(text: str, how: str) -> str:
    """One timestamp spelled another way (the same instant unless `how` says otherwise)."""
    t = parse_time(text)
    if how == "Z":
        return t.astimezone(_dt.timezone.utc).isoformat().replace("+00:00", "Z")
    if how == "offset":
        return t.astimezone(_dt.timezone(_dt.timedelta(hours=5, minutes=30))).isoformat()
    if how == "negative_offset":
        return t.astimezone(_dt.timezone(_dt.timedelta(hours=-7))).isoformat()
    if how == "micro_zero":
        return t.isoformat(timespec="microseconds")
    if how == "micro":
        return (t + _dt.timedelta(microseconds=123456)).isoformat(timespec="microseconds")
    if how == "space":
        return t.isoformat(sep=" ")
    if how == "naive":
        return t.replace(tzinfo=None).isoformat()
    raise ValueError(how)


# ---------------------------------------------------------------------------- copies


def copy_leg(src: Path, name: str, pid_shift: int = 100_000) -> Path:
    """The leg copied beside itself under `name`, its process ids moved (another run's pids), resealed."""
    dst = src.parent / name
    shutil.copytree(src, dst)
    edit_meta(dst, lambda m: [p.update(pid=p["pid"] + pid_shift) for p in m.get("processes") or []
                              if isinstance(p.get("pid"), int)])
    return dst


def copy_tput_round(legs: Sequence[Path], c: int, src_round: int, new_round: int, hours: float = 6.0) -> list[Path]:
    """Both legs of round `src_round` at concurrency c copied as round `new_round`: leg.json and
    bench.json renumbered, work times and the bench date moved by `hours`, pids moved, resealed."""
    out = []
    delta = _dt.timedelta(hours=hours)
    for leg in legs:
        m = meta(leg)
        if m.get("item") != "throughput" or m.get("concurrency") != c or m.get("round") != src_round:
            continue
        dst = copy_leg(leg, f"{leg.name}__copy_as_r{new_round}", pid_shift=1000 * new_round)

        def relabel(mm: dict[str, Any]) -> None:
            mm["round"] = new_round
            shift_times(mm, delta)
        edit_meta(dst, relabel)

        def rebench(b: dict[str, Any]) -> None:
            if "round" in b:
                b["round"] = str(new_round)
            shift_bench_date(b, delta)
        edit_json(dst / "bench.json", rebench, dst)
        out.append(dst)
    return out


def copy_forward_step(fdir: Path, leg: Path, src_step: int, new_step: int | None = None,
                      checkpoint: str | None = None) -> int:
    """A forward receipt's step (metrics row + arrays) copied under a new step number."""
    rows = read_rows(fdir / "metrics.jsonl")
    new = new_step if new_step is not None else max(r["step"] for r in rows) + 1
    src = next(r for r in rows if r["step"] == src_step)
    row = dict(copy.deepcopy(src), step=new)
    if checkpoint is not None:
        row["checkpoint_version"] = checkpoint
    arrays = fdir / "arrays" / f"step_{src_step:04d}.npz"
    if arrays.is_file():
        shutil.copy2(arrays, fdir / "arrays" / f"step_{new:04d}.npz")
    rows = sorted([*rows, row], key=lambda r: r["step"])
    write_rows(fdir / "metrics.jsonl", rows, leg)
    return new


def recompute_forward(fdir: Path, leg: Path, fn: Callable[[dict[str, np.ndarray]], None],
                      steps: Sequence[int] | None = None) -> None:
    """Edit each step's arrays with fn and write the metrics an honest producer computes from them."""
    rows = read_rows(fdir / "metrics.jsonl")
    for row in rows:
        if steps is not None and row["step"] not in steps:
            continue
        path = fdir / "arrays" / f"step_{row['step']:04d}.npz"
        if not path.is_file():  # a logged-only receipt: nothing to recompute from
            continue
        data = load_npz(path)
        fn(data)
        save_npz(path, data)
        row.update(forward_metrics(data["trainer_logprobs"], data["rollout_logprobs"]))
        if "tica/content_sha256" in row:
            row["tica/content_sha256"] = step_content_digest(data["token_ids"], data["seq_lens"],
                                                             data["trainer_logprobs"], data["rollout_logprobs"])
    write_rows(fdir / "metrics.jsonl", rows, leg)


def logged_only(fdir: Path, leg: Path, step: int | None, **kv: Any) -> None:
    """A forward receipt logged only (no arrays, content digests kept), with logged values planted at one step
    (or every step)."""
    cn.drop_arrays_keep_digests(fdir, leg)
    edit_rows(fdir / "metrics.jsonl", lambda rows: [r.update(kv) for r in rows if step is None or r["step"] == step], leg)


def upper_hex(text: str) -> str:
    """A digest's hex in upper case, its algorithm prefix as written."""
    algo, sep, hexpart = text.partition(":")
    if not sep:
        return text.upper()
    return f"{algo}:{hexpart.upper()}"


def is_hexdigest(text: Any) -> bool:
    return isinstance(text, str) and bool(re.fullmatch(r"(sha256|blake3):[0-9a-f]{16,}", text))
