"""One recipe, one image, a switch selects the arm.

From the recipe's resolved commands, printed in its dry-run (and compose) mode for every
mode x optimizer before and after a change: BI=1 must be byte-identical (sha256); BI=0 against
the original baseline recipe may differ only in names, paths and newly added explicit switches;
every combination must have returned rc 0. Anything else fails with the differing tokens shown.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from tica.judging import JUDGE_VERSION, Findings, md_table
from tica.receipts import RecipeCombo, load_recipe_dry_runs
from tica.verdict import Verdict

# The keys (last component, `-` read as `_`) whose value only names a run or says where its
# outputs go: BI=0 paths are suffixed so arms never share a checkpoint directory, a required
# difference, not a recipe change. An explicit table, failing closed: a key not listed here (a
# model, tokenizer, data or load path, an engine name) changes what is computed, whatever its
# name or value looks like.
NAME_OR_OUTPUT_KEYS: frozenset[str] = frozenset({
    "experiment_name", "project_name", "run_name", "exp_name", "job_name", "trial_name", "group_name",
    "name_suffix", "name_prefix", "tags", "tag", "run_id",
    "default_local_dir", "default_hdfs_dir", "output_dir", "output_path", "save_dir", "save_path", "ckpt_dir",
    "checkpoint_dir", "log_dir", "logging_dir", "log_path", "tensorboard_dir", "wandb_dir", "rollout_data_dir",
    "validation_data_dir", "trace_dir", "profile_dir",
})
_SWITCH = re.compile(r"^(\+\+|\+|~)?[A-Za-z_][\w.\-/]*=")


class TokenChange(BaseModel):
    model_config = ConfigDict(frozen=True)

    before: str | None
    after: str | None
    allowed: bool
    why: str


class RecipeIdentityResult(BaseModel):
    """The recipe-identity check. Not an evidence item of its own: it gates every item."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    verdict: Verdict
    summary: str
    reasons: tuple[str, ...] = ()
    numbers: dict[str, Any] = {}
    tables: dict[str, str] = {}
    receipt_hash: str = ""
    judge_version: str = JUDGE_VERSION


def tokens(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def sha256_text(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _key(tok: str) -> str | None:
    m = _SWITCH.match(tok)
    if m:
        return tok[: m.end() - 1].lstrip("+~")
    if tok.startswith("-"):
        return tok.split("=", 1)[0].lstrip("-")
    return None


def _is_name_or_path(key: str | None) -> bool:
    """Whether the key's value only names the run or its outputs (NAME_OR_OUTPUT_KEYS). Only the
    key's last component counts: `rollout.name` selects an engine, it is not a name."""
    last = key.split(".")[-1].lstrip("-").replace("-", "_").lower() if key else ""
    return last in NAME_OR_OUTPUT_KEYS


def _env_key(tok: str) -> str | None:
    m = re.match(r"^([A-Z_][A-Z0-9_]*)=", tok)
    return m.group(1) if m else None


def bi0_changes(before: str, after: str) -> list[TokenChange]:
    """Every token difference of a BI=0 command against the original baseline, each judged."""
    a, b = tokens(before), tokens(after)
    before_keys = {_key(t) for t in a} - {None}
    out: list[TokenChange] = []

    def inserted(toks: Sequence[str]) -> None:
        i = 0
        while i < len(toks):
            t = toks[i]
            k = _key(t) or _env_key(t)
            if k is None:
                out.append(TokenChange(before=None, after=t, allowed=False, why="added a token that is not a switch"))
            elif k in before_keys:
                out.append(TokenChange(before=None, after=t, allowed=False, why=f"sets {k} again, which the baseline already sets"))
            else:
                out.append(TokenChange(before=None, after=t, allowed=True, why=f"newly added explicit switch {k}"))
                # `--flag value`: the value belongs to the switch just added.
                if t.startswith("-") and "=" not in t and i + 1 < len(toks) and not toks[i + 1].startswith("-"):
                    i += 1
                    out.append(TokenChange(before=None, after=toks[i], allowed=True, why=f"value of new switch {k}"))
            i += 1

    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        if op == "insert":
            inserted(b[j1:j2])
            continue
        pairs = min(i2 - i1, j2 - j1) if op == "replace" else 0
        for k in range(pairs):
            ta, tb = a[i1 + k], b[j1 + k]
            key_a, key_b = _key(ta) or _env_key(ta), _key(tb) or _env_key(tb)
            if key_a is None and i1 + k > 0 and a[i1 + k - 1].startswith("-"):
                key_a = key_b = a[i1 + k - 1].lstrip("-")  # the value of a `--flag value` pair
            if key_a != key_b:
                out.append(TokenChange(before=ta, after=tb, allowed=False, why="a different switch in this place"))
            elif _is_name_or_path(key_a):
                out.append(TokenChange(before=ta, after=tb, allowed=True, why=f"name/path {key_a or 'argument'}"))
            else:
                out.append(TokenChange(before=ta, after=tb, allowed=False, why=f"value of {key_a or 'argument'} changed"))
        for t in a[i1 + pairs:i2]:
            out.append(TokenChange(before=t, after=None, allowed=False, why="removed from the baseline command"))
        if j1 + pairs < j2:
            inserted(b[j1 + pairs:j2])
    return out


def all_changes(before: str, after: str) -> list[TokenChange]:
    """Token differences for display where nothing may differ (BI=1)."""
    a, b = tokens(before), tokens(after)
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op != "equal":
            n = max(i2 - i1, j2 - j1)
            for k in range(n):
                ta = a[i1 + k] if i1 + k < i2 else None
                tb = b[j1 + k] if j1 + k < j2 else None
                out.append(TokenChange(before=ta, after=tb, allowed=False, why="BI=1 must be byte-identical"))
    if not out and before != after:
        out.append(TokenChange(before=repr(before), after=repr(after), allowed=False, why="whitespace or quoting differs"))
    return out


def _show(changes: Sequence[TokenChange]) -> str:
    return "; ".join(f"-{c.before!r} +{c.after!r} ({c.why})" for c in changes)


def judge_combo(combo: RecipeCombo, label: str) -> tuple[Findings, list[TokenChange], bool | None]:
    f = Findings()
    if combo.before is None or combo.after is None:
        f.inconclusive(f"{label}: not printed {'before' if combo.before is None else 'after'} the change")
        return f, [], None
    for when, rc in (("before", combo.before.rc), ("after", combo.after.rc)):
        if rc != 0:
            f.fail(f"{label}: {combo.mode} {when} the change returned rc {rc}")
    identical = sha256_text(combo.before.command) == sha256_text(combo.after.command)
    changes: list[TokenChange] = []
    if combo.arm == "bi1":
        if not identical:
            changes = all_changes(combo.before.command, combo.after.command)
            f.fail(f"{label}: BI=1 command changed: {_show(changes)}")
    elif not identical:
        changes = bi0_changes(combo.before.command, combo.after.command)
        bad = [c for c in changes if not c.allowed]
        if bad:
            f.fail(f"{label}: BI=0 differs from the original baseline beyond names, paths and new switches: {_show(bad)}")
    return f, changes, identical


def judge_recipe_identity(path: str | Path) -> RecipeIdentityResult:
    runs, digest = load_recipe_dry_runs(path)
    findings = Findings()
    rows, combos = [], []
    for combo in runs.combos:
        label = f"{combo.mode} x {combo.optimizer} x {combo.arm}"
        f, changes, identical = judge_combo(combo, label)
        findings.extend(f)
        rows.append([combo.mode, combo.optimizer, combo.arm,
                     sha256_text(combo.before.command)[:19] if combo.before else None,
                     sha256_text(combo.after.command)[:19] if combo.after else None,
                     combo.before.rc if combo.before else None, combo.after.rc if combo.after else None,
                     identical, _show(changes), f.verdict.value])
        combos.append({"mode": combo.mode, "optimizer": combo.optimizer, "arm": combo.arm, "identical": identical,
                       "changes": [c.model_dump() for c in changes], "verdict": f.verdict.value})
    seen = {(c.mode, c.optimizer, c.arm) for c in runs.combos}
    grid = {(m, o) for m, o, _ in seen}
    for m, o in sorted(grid):
        for arm in ("bi1", "bi0"):
            if (m, o, arm) not in seen:
                findings.inconclusive(f"{m} x {o}: no {arm} command printed")
    if "dry_run" not in {m for m, _ in grid}:
        findings.inconclusive("no dry-run combination: the resolved training command was never printed")
    v = findings.verdict
    return RecipeIdentityResult(
        verdict=v,
        summary=f"{v.value}: recipe {runs.recipe}: {len(runs.combos)} combination(s) over "
                f"{len({o for _, o in grid})} optimizer(s) and modes {sorted({m for m, _ in grid})}",
        reasons=findings.reasons(),
        numbers={"combos": combos},
        tables={"per combination": md_table(
            ["mode", "optimizer", "arm", "before sha256", "after sha256", "rc before", "rc after", "identical",
             "token differences", "verdict"], rows)},
        receipt_hash=digest,
    )
