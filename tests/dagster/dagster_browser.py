"""The real `dagster dev` on loopback and headless Debian chromium, for the browser test."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from tica_assets.settings import PROJECT_ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DAGSTER = Path(os.environ.get("VIRTUAL_ENV", PROJECT_ROOT / ".venv")) / "bin" / "dagster"
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(base: str, query: str, variables: dict | None = None, timeout: float = 30) -> dict:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    req = urllib.request.Request(f"{base}/graphql", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def wait_for(predicate, timeout: float, what: str, interval: float = 2.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except OSError as err:  # server not up yet
            last = err
        time.sleep(interval)
    raise TimeoutError(f"{what} not within {timeout:.0f}s (last: {last!r})")


ASSETS_LOADED = "{ assetNodes { assetKey { path } } }"
ALL_STALE = """query($group: String!) { assetNodes(group: {groupName: $group, repositoryName: "__repository__",
  repositoryLocationName: "tica"}) { assetKey { path } staleStatus } }"""
# What the canvas draws for a node's checks: each check's latest execution and its severity.
CHECKS = """query($path: [String!]!) { assetNodeOrError(assetKey: {path: $path}) { ... on AssetNode {
  assetChecksOrError { ... on AssetChecks { checks { name executionForLatestMaterialization {
    status evaluation { severity } } } } } } } }"""
TICKS = """query { sensorOrError(sensorSelector: {repositoryName: "__repository__", repositoryLocationName: "tica",
  sensorName: "tica_manifest_sensor"}) { ... on Sensor { sensorState { ticks(limit: 20) { status skipReason } } } } }"""


def drawn_check(base: str, path: list[str], name: str) -> tuple[str, str | None]:
    """(status, severity) of a node's check as the canvas draws it."""
    node = graphql(base, CHECKS, {"path": path})["data"]["assetNodeOrError"]
    (check,) = [c for c in node["assetChecksOrError"]["checks"] if c["name"] == name]
    run = check["executionForLatestMaterialization"]
    return run["status"], (run["evaluation"] or {}).get("severity")


def stale_nodes(base: str, group: str = "demo") -> set[str]:
    """The labels of the group's nodes that the UI calls stale."""
    nodes = graphql(base, ALL_STALE, {"group": group})["data"]["assetNodes"]
    return {n["assetKey"]["path"][-1] for n in nodes if n["staleStatus"] == "STALE"}




@contextlib.contextmanager
def dagster_dev(env: dict[str, str], log_path: Path, timeout: float = 240, root: Path = PROJECT_ROOT):
    """`dagster dev -w workspace.yaml` of the project at `root` (this checkout, or a clone of it)
    in its own process group; yields the base URL. Stopped
    with SIGTERM to dagster dev first, then to whatever it left in its group."""
    port = free_port()
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [str(DAGSTER), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: proc.poll() is None and graphql(base, ASSETS_LOADED)["data"]["assetNodes"],
                 timeout, "the code location in dagster dev")
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        for sig in (signal.SIGTERM, signal.SIGKILL):  # children dagster dev left behind
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(5)
        log.close()


def chromium(url: str, *, screenshot: Path | None = None, budget_ms: int = 20000, size: str = "1600,1000") -> str:
    """The DOM after `budget_ms` of virtual time (or a screenshot), from a fresh profile."""
    profile = tempfile.mkdtemp(prefix="tica-chromium-")
    try:
        args = [CHROMIUM, *CHROMIUM_FLAGS, f"--window-size={size}", f"--user-data-dir={profile}",
                f"--virtual-time-budget={budget_ms}"]
        args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
        out = subprocess.run([*args, url], capture_output=True, timeout=180, check=False)
        return out.stdout.decode(errors="replace")
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def visible_text(dom: str) -> str:
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    text = re.sub(r"<[^>]+>", "\n", dom)
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def graph_nodes(dom: str) -> dict[str, bool]:
    """Asset-graph node label -> whether it carries the stale (unsynced) marker."""
    return {_label(fo): "StaleDot" in fo or "Unsynced" in fo
            for fo in re.findall(r"<foreignObject\b.*?</foreignObject>", dom, flags=re.S)}


def marked_graph(url: str) -> dict[str, bool] | None:
    """graph_nodes of the whole canvas once it draws an unsynced marker on some node, else None."""
    nodes = graph_nodes(chromium(url, size="1600,1800"))
    return nodes if any(nodes.values()) else None


def _label(node: str) -> str:
    """A node's asset name: the zoomed-in node's name element, the zoomed-out node's whole text."""
    named = re.search(r'AssetNode_assetName[^"]*".*?data-tooltip="([^"]+)"', node, flags=re.S)
    return named.group(1) if named else " ".join(re.sub(r"<[^>]+>", " ", node).split())


def node_colours(dom: str) -> dict[str, str]:
    """Asset-graph node label -> the colour the canvas draws its status with: the zoomed-out
    node's `--minimal-bg`, or the zoomed-in node's status row, e.g. a red or a green colour
    variable; '' where the node sets none."""
    out = {}
    for fo in re.findall(r"<foreignObject\b.*?</foreignObject>", dom, flags=re.S):
        colour = (re.search(r"--minimal-bg:\s*([^;\"]+)", fo)
                  or re.search(r"background-color:\s*(var\(--color-background-[\w-]+\))", fo))
        out[_label(fo)] = colour.group(1).strip() if colour else ""
    return out
