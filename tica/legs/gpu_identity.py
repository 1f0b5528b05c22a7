"""The GPU a Ray leg job was given, read on its node just before its producer starts, then the
producer itself (exec'd: same pid, same stdio, so Dagster Pipes' log tail is unchanged).

    python -m tica.legs.gpu_identity --record <leg>.gpu.json -- python -m tica.legs.<item> ...

Ray hands the job's entrypoint `CUDA_VISIBLE_DEVICES` (the node's device indices, as nvidia-smi
numbers them); nvidia-smi gives each index its UUID and name. The producer's environment gets
`TICA_GPU_UUID` (and `CUDA_DEVICE_ORDER=PCI_BUS_ID`, so CUDA numbers devices as nvidia-smi does),
which every producer records in leg.json's env; a UUID nvidia-smi does not give is `unknown`,
never guessed. A leg granted no GPU (`TICA_LEG_GPUS=0`) is given none: Ray leaves a GPU-less
job the node's own `CUDA_VISIBLE_DEVICES`, which would let it onto a device another leg holds.

Standard library only: it runs on the GPU node before anything else.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

UNKNOWN = "unknown"
QUERY = ["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"]


def _nvidia_smi() -> tuple[list[dict[str, str]], str | None]:
    """(rows of index, uuid, name; why none were read, or None)."""
    try:
        out = subprocess.run(QUERY, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return [], f"nvidia-smi unavailable: {type(err).__name__}"
    if out.returncode != 0:
        return [], f"nvidia-smi exited {out.returncode}"
    rows = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            rows.append({"index": parts[0], "uuid": parts[1], "name": ",".join(parts[2:])})
    return rows, None if rows else "nvidia-smi listed no GPU"


def identify(env: dict[str, str]) -> dict:
    """The devices this process may use: CUDA_VISIBLE_DEVICES and, where nvidia-smi says, each one's UUID."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    entries = [v.strip() for v in visible.split(",") if v.strip()] if visible else []
    rows, why = _nvidia_smi() if entries else ([], None)
    devices = []
    for entry in entries:
        row = next((r for r in rows if entry in (r["index"], r["uuid"])), None)
        devices.append({"visible": entry, "index": row["index"] if row else None,
                        "uuid": row["uuid"] if row else UNKNOWN, "name": row["name"] if row else None})
    return {
        "host": socket.gethostname(), "pid": os.getpid(),
        "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "cuda_visible_devices": visible, "devices": devices,
        "uuid": ",".join(d["uuid"] for d in devices) if devices else None,
        "unread_because": why if any(d["uuid"] == UNKNOWN for d in devices) else None,
    }


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("usage: python -m tica.legs.gpu_identity --record PATH -- COMMAND ...")
    at = argv.index("--")
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", required=True)
    args = ap.parse_args(argv[:at])
    command = argv[at + 1:]
    env = dict(os.environ)
    if env.get("TICA_LEG_GPUS") == "0":
        env["CUDA_VISIBLE_DEVICES"] = ""
    record = identify(env)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if record["uuid"] is not None:
        env["TICA_GPU_UUID"] = record["uuid"]
    Path(args.record).parent.mkdir(parents=True, exist_ok=True)
    Path(args.record).write_text(json.dumps(record, indent=1))
    sys.stdout.flush()
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    main()
