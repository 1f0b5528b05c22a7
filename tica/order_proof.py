"""A question's freeze, proven by a signed ledger chain that travels with the receipts.

Receipts replayed into another ledger (the demo's, a reviewer's) meet their questions there after
the fact: that ledger froze them when it first saw them. The ledger that froze them before the run
can travel with the run instead, in a folder `frozen/` beside the run's leg folders:

* `chain.jsonl`: that ledger exported (`tica ledger export`), every row with its hash;
* `head.json`: its head, signed (`tica ledger head --sign-key`).

The proof holds when every row of the export checks (content hash, link to the row before), its
last row is the head, the head's signature verifies under a key this deployment trusts
(TICA_TRUSTED_KEYS: a folder of PEM public keys; a key shipped with the receipts is never trusted
for being there), and the chain holds the question's freeze row. That row's time is then the
question's freeze time for the legs of that run. A proof that does not hold proves nothing and
says why; it never makes a freeze earlier.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tica.errors import InputError, input_text
from tica.head_signing import key_id, load_public_key, signature_problem
from tica.ledger import Head
from tica.ledger.transfer import read_export
from tica.messages import relative

PROOF_DIR = "frozen"
CHAIN_FILE = "chain.jsonl"
HEAD_FILE = "head.json"
TRUSTED_KEYS_ENV = "TICA_TRUSTED_KEYS"


@dataclass(frozen=True)
class FreezeProof:
    """What a run's signed chain shows: when each question in it was frozen."""

    folder: Path
    frozen_at: Mapping[str, str]  # question hash -> the time its first freeze row was chained
    signed_by: str
    head_seq: int

    def says(self) -> str:
        return f"the signed chain in {relative(str(self.folder))} (head seq {self.head_seq}, signed by {self.signed_by})"


def trusted_keys(folder: str | Path | None = None) -> dict[str, Ed25519PublicKey]:
    """The public keys this deployment trusts to sign a freeze, by key id: every *.pem in
    `folder` (default $TICA_TRUSTED_KEYS; none set: no key is trusted)."""
    from tica.settings import setting

    where = folder if folder is not None else setting("trusted_keys")
    if not where:
        return {}
    path = Path(where)
    if not path.is_dir():
        raise InputError(path, TRUSTED_KEYS_ENV, "is not a folder of PEM public keys")
    keys = [load_public_key(p) for p in sorted(path.glob("*.pem"))]
    return {key_id(k): k for k in keys}


def read_proof(folder: str | Path, trusted: Mapping[str, Ed25519PublicKey]) -> FreezeProof:
    """The proof in `folder` (a run's `frozen/`); InputError naming the file and what fails."""
    folder = Path(folder)
    head_path = folder / HEAD_FILE
    head = Head.from_json(input_text(head_path, max_bytes=64 * 1024), str(head_path))
    exported, rows = read_export(folder / CHAIN_FILE)  # every row's hash and link checked
    if (exported.seq, exported.row_hash) != (head.seq, head.row_hash) or exported.recorded_at != head.recorded_at:
        raise InputError(head_path, "row_hash", f"the head (seq {head.seq}) is not the last row of {CHAIN_FILE}")
    if head.signed_by is None or head.signed_by not in trusted:
        raise InputError(head_path, "signed_by", f"signed by {head.signed_by or 'no key'}, which this deployment does "
                                                 f"not trust ({TRUSTED_KEYS_ENV} names {len(trusted)} key(s))")
    if (problem := signature_problem(head, trusted[head.signed_by])) is not None:
        raise InputError(head_path, "signature", problem)
    frozen: dict[str, str] = {}
    for table, data, payload in rows:
        if table == "questions":
            frozen.setdefault(payload["question_hash"], data["recorded_at"])
    return FreezeProof(folder, frozen, head.signed_by, head.seq)


def proven_freezes(legs: Sequence[Path], question_hash: str, trusted: Mapping[str, Ed25519PublicKey]
                   ) -> tuple[dict[Path, tuple[str, str]], dict[Path, str]]:
    """Per run folder (a leg's parent) that carries a proof: (freeze time, what proves it) where
    the proof holds and names this question, else why not."""
    proven: dict[Path, tuple[str, str]] = {}
    problems: dict[Path, str] = {}
    for run in sorted({Path(leg).parent for leg in legs}):
        folder = run / PROOF_DIR
        if not folder.is_dir():
            continue
        try:
            proof = read_proof(folder, trusted)
        except InputError as err:
            problems[run] = str(err)
            continue
        if question_hash not in proof.frozen_at:
            problems[run] = f"{proof.says()} does not freeze this question"
            continue
        proven[run] = (proof.frozen_at[question_hash], proof.says())
    return proven, problems
