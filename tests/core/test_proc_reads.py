"""Process facts come from psutil; the project reads /proc itself only where psutil has no answer,
each place named here with why. A new hand-written /proc read fails this scan."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tica", "resources", "tica_assets", "sensors")

# (module, the /proc file it reads): why psutil cannot serve it
ALLOWED = {
    ("tica/leg_run.py", "environ"): "psutil parses environ leniently; a retitled process's overwritten memory must read as unknown",
    ("tica/leg_run.py", "proc"): "the root read_environ reads under (a test gives it a fake one)",
    ("tica/leg_run.py", "stat"): "start ticks (psutil's create_time moves with a clock step) and a zombie's exit status",
    ("tica/legs/common.py", "status"): "a thread's blocked and ignored signal masks are not in psutil",
    ("tica/legs/common.py", "boot_id"): "the boot's identity (psutil has its time only)",
    ("tica/legs/common.py", "cpuinfo"): "the CPU's model name is not in psutil",
}


def proc_reads(source: str) -> set[str]:
    """The /proc files a module's string literals name (f-strings included), by their last part."""
    tree = ast.parse(source)
    inner = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inner:
            text = node.value
        else:
            continue
        if text.startswith("/proc"):
            path = text.split()[0].rstrip(":")
            found.add(path.rstrip("/").rsplit("/", 1)[-1])
    return found


def _modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path.read_text()


def test_every_hand_written_proc_read_is_one_psutil_cannot_make():
    seen = {(name, what) for name, text in _modules() for what in proc_reads(text)}
    assert seen - set(ALLOWED) == set(), "read these through psutil (tica/legs/common.py)"
    assert set(ALLOWED) - seen == set(), "an allowed read is gone: drop it from ALLOWED"


def test_the_scan_sees_a_proc_read_in_an_f_string_and_a_path():
    """The negative control: the reads this change replaced would be caught."""
    assert proc_reads('open(f"/proc/{pid}/cmdline")') == {"cmdline"}
    assert proc_reads('Path("/proc/cpuinfo")') == {"cpuinfo"}
    assert proc_reads('"no proc here"') == set()
