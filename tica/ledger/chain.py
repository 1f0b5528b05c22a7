"""The chain's format: how a row is hashed onto the one before it (row_hash, and FAST_BODIES, the
same bytes per table twice as fast), the published head (Head), and how a chain read in seq order
is checked, whole or in pieces joined afterwards (check_segment, join_segments, verify_entries).
No database is imported here: every store, and every range of a parallel verify, hashes with this."""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import heapq
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from tica.ledger.schema import TABLES

GENESIS = "genesis"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


_quote = json.encoder.encode_basestring_ascii  # what json.dumps writes for a str (ensure_ascii)


def _json_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return _quote(value)
    if type(value) is int:
        return int.__repr__(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@functools.lru_cache(maxsize=64)
def _sorted_keys(keys: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((k, _quote(k) + ":") for k in sorted(keys))


def _body(table: str, seq: int, recorded_at: str, payload: Mapping[str, Any]) -> str:
    """json.dumps({"table", "seq", "recorded_at", "payload"}, sort_keys=True, compact), written
    directly: verify hashes every row, and the general encoder was half its time. A test holds
    it byte-equal to json.dumps over random payloads."""
    fields = ",".join(quoted + _json_value(payload[k]) for k, quoted in _sorted_keys(tuple(payload)))
    return (f'{{"payload":{{{fields}}},"recorded_at":{_quote(recorded_at)},'
            f'"seq":{_json_value(seq)},"table":{_quote(table)}}}')


def row_hash(prev_hash: str, table: str, seq: int, recorded_at: str, payload: Mapping[str, Any]) -> str:
    return hashlib.sha256(f"{prev_hash}\n{_body(table, seq, recorded_at, payload)}".encode()).hexdigest()


def extend_chain(head: tuple[int, str], prepared: Sequence[tuple[str, Mapping[str, Any]]]
                 ) -> list[tuple[str, dict[str, Any], Mapping[str, Any]]]:
    """(table, chain columns, payload) for rows appended after `head` (seq, row_hash): each
    numbered, timed and hashed onto the one before it. Any store inserts them as they are. A payload
    of exactly its table's columns in TABLES order (checked_payload's) is hashed through
    FAST_BODIES, verify's own body functions (byte-identical to row_hash's, tested); any other
    through row_hash."""
    seq, prev = head
    out = []
    sha256, now, utc = hashlib.sha256, _dt.datetime.now, _dt.timezone.utc
    for table, payload in prepared:
        seq += 1
        at = now(utc).isoformat(timespec="microseconds")  # _now()
        if tuple(payload) == _COLUMN_NAMES.get(table):
            digest = sha256(f"{prev}\n{FAST_BODIES[table](seq, at, payload.values())}".encode()).hexdigest()
        else:
            digest = row_hash(prev, table, seq, at, payload)
        out.append((table, {"seq": seq, "prev_hash": prev, "row_hash": digest, "recorded_at": at}, payload))
        prev = digest
    return out


@dataclass(frozen=True)
class Head:
    """The chain's tail, published to anchor it: `verify --expect-head` fails when the row at
    this seq no longer has this hash (truncation or a rewrite up to it). A head may carry an
    Ed25519 signature by a key its publisher holds (tica.head_signing)."""

    seq: int
    row_hash: str
    recorded_at: str
    signature: str | None = None
    signed_by: str | None = None

    def to_json(self) -> str:
        data: dict[str, Any] = {"seq": self.seq, "row_hash": self.row_hash, "recorded_at": self.recorded_at}
        if self.signature is not None:
            data |= {"signature": self.signature, "signed_by": self.signed_by}
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str, source: str = "<head>") -> "Head":
        from tica.errors import InputError

        from tica import strict_io

        try:  # duplicate keys refused (two `seq`s name no head), nesting bounded
            data = strict_io.loads(text)
        except strict_io.StrictInputError as err:
            raise InputError(source, "<json>", str(err)) from None
        if not isinstance(data, dict):
            raise InputError(source, "<root>", "a head is {seq, row_hash, recorded_at}")
        unknown = sorted(set(data) - {"seq", "row_hash", "recorded_at", "signature", "signed_by"})
        if unknown:
            raise InputError(source, unknown[0], "not a field of a published head")
        seq, digest, at = data.get("seq"), data.get("row_hash"), data.get("recorded_at")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise InputError(source, "seq", f"{seq!r} is not a row number")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}|genesis", digest):
            raise InputError(source, "row_hash", f"{digest!r} is not a sha256 hex digest")
        if not isinstance(at, str):
            raise InputError(source, "recorded_at", f"{at!r} is not a time")
        for name in ("signature", "signed_by"):
            if data.get(name) is not None and not isinstance(data[name], str):
                raise InputError(source, name, f"{data[name]!r} is not text")
        if (data.get("signature") is None) != (data.get("signed_by") is None):
            missing = "signed_by" if data.get("signed_by") is None else "signature"
            raise InputError(source, missing, "a signed head carries its signature and its signer's name, both or neither")
        return cls(seq=seq, row_hash=digest, recorded_at=at, signature=data.get("signature"),
                   signed_by=data.get("signed_by"))


@dataclass(frozen=True)
class VerifyReport:
    rows: int
    head_hash: str
    problems: tuple[str, ...]
    head_seq: int = 0
    head_recorded_at: str = ""

    @property
    def head(self) -> Head:
        return Head(seq=self.head_seq, row_hash=self.head_hash, recorded_at=self.head_recorded_at)

    @property
    def ok(self) -> bool:
        return not self.problems


def _body_parts(table: str, plain: frozenset[str] = frozenset(),
                quoted: frozenset[str] = frozenset()) -> tuple[list[str], list[str]]:
    """`_body` for `table`'s payload as the parts of one ''.join: (the local name of each payload
    column in TABLES order, the parts as Python expressions). The key order, the key quoting and the
    constant text are worked out once; each value is encoded as `_json_value` would (a str or int
    inline, anything else, None included, through `_json_value` itself), except the text columns
    the caller has checked (recorded_at among them): those in `plain` are set and plain (printable
    ASCII without a quote or a backslash), which json.dumps writes as it is between quotes; those in
    `quoted` are set, printable ASCII and without a backslash, which json.dumps writes between
    quotes with each '"' as '\\"' and nothing else changed."""
    names = [n for n, _ in TABLES[table]]
    kinds = dict(TABLES[table])
    local = {n: f"v{k}" for k, n in enumerate(names)}
    parts: list[str] = []
    constant = '{"payload":{'

    def value(name: str, expr: str, enc: str) -> None:
        nonlocal constant
        if name in plain or name in quoted:
            parts.extend([repr(constant + '"'),
                          expr if name in plain else f"{expr}.replace({chr(34)!r}, {chr(92) + chr(34)!r})"])
            constant = '"'
        else:
            parts.extend([repr(constant), enc])
            constant = ""

    for k, name in enumerate(sorted(names)):
        v = local[name]
        constant += ("," if k else "") + _quote(name) + ":"
        if kinds[name] == "BIGINT":
            value("", v, f"(_int_repr({v}) if {v}.__class__ is int else _json_value({v}))")
        else:
            value(name, v, f"(_quote({v}) if {v}.__class__ is str else _NULL if {v} is None else _json_value({v}))")
    constant += '},"recorded_at":'
    value("recorded_at", "recorded_at", "_quote(recorded_at)")
    constant += ',"seq":'
    value("", "seq", "(_int_repr(seq) if seq.__class__ is int else _json_value(seq))")
    parts.append(repr(constant + f',"table":{_quote(table)}}}'))
    return [local[n] for n in names], parts


def _fast_body_source(table: str) -> str:
    """The source of `table`'s body function: `_body` for that table's payload (every column of
    TABLES[table], in TABLES order), from `_body_parts`."""
    names, parts = _body_parts(table)
    unpack = f"    {', '.join(names)}, = values\n" if names else ""
    return (f"def body(seq, recorded_at, values):\n{unpack}"
            f"    return ''.join(({', '.join(parts)}))\n")


_BODY_NAMESPACE = {"_quote": _quote, "_json_value": _json_value, "_int_repr": int.__repr__, "_NULL": "null",
                   "_sha256": hashlib.sha256}


def _make_fast_body(table: str) -> Callable[[int, str, Sequence[Any]], str]:
    namespace = dict(_BODY_NAMESPACE)
    exec(compile(_fast_body_source(table), f"<tica.ledger body of {table}>", "exec"), namespace)  # noqa: S102
    return namespace["body"]


# table -> body(seq, recorded_at, values in TABLES order): byte-identical to
# _body(table, seq, recorded_at, dict(zip(names, values))) (a test holds them equal for every
# column type and value kind), about twice as fast; verify hashes every row with it.
FAST_BODIES: dict[str, Callable[[int, str, Sequence[Any]], str]] = {t: _make_fast_body(t) for t in TABLES}
_COLUMN_NAMES: dict[str, tuple[str, ...]] = {t: tuple(n for n, _ in cols) for t, cols in TABLES.items()}


def merge_chain(streams: Sequence[Iterable[tuple[int, str, str, str, str, tuple]]]
                ) -> Iterator[tuple[int, str, str, str, str, tuple]]:
    """One table's entries per stream, each in seq order, streams in TABLES order: the chain in
    seq order, rows of equal seq (only ever in a tampered ledger) in TABLES order, exactly as
    sorting the concatenated tables by seq orders them."""
    return heapq.merge(*streams, key=itemgetter(0))


@dataclass
class ChainSegment:
    """What re-hashing one contiguous piece of the chain found: the piece's rows were read in seq
    order and its first row sits at chain position `start` (1-based)."""

    start: int
    linked: bool = True  # whether its first row's link was checked here (else join_segments checks it)
    count: int = 0
    first: tuple[int, str, str] | None = None  # (seq, table, stored prev_hash) of its first row
    last_hash: str | None = None  # the stored row_hash of its last row
    last_at: str = ""
    held: str | None = None  # the stored hash of its last row whose seq is the published head's
    problems: list[tuple[int, int, str]] | None = None  # (position, 0 seq | 1 link | 2 content, message)


def check_segment(entries: Iterable[tuple[int, str, str, str, str, tuple]], start: int, want: int | None,
                  link_to: str | None) -> ChainSegment:
    """Re-hash a contiguous piece of the chain: every row's seq against its position, its link
    against the row before it (the piece's first row against `link_to`; None leaves that one link
    to whoever knows the row before the piece) and its content against its row_hash."""
    seg = ChainSegment(start=start, linked=link_to is not None, problems=[])
    found = seg.problems
    names_of = {t: [n for n, _ in cols] for t, cols in TABLES.items()}
    widths = {t: len(cols) for t, cols in TABLES.items()}
    bodies, sha256 = FAST_BODIES, hashlib.sha256
    prev = link_to
    for pos, (seq, table, prev_hash, digest, recorded_at, values) in enumerate(entries, start=start):
        if seg.first is None:
            seg.first = (seq, table, prev_hash)
        seg.count, seg.last_at = seg.count + 1, recorded_at
        if seq != pos:
            found.append((pos, 0, f"{table} seq={seq}: expected seq {pos} (a row was removed or inserted)"))
        if prev is not None and prev_hash != prev:
            found.append((pos, 1, f"{table} seq={seq}: prev_hash does not match the row before it"))
        body = bodies.get(table)
        if body is not None and len(values) == widths[table]:
            recomputed = sha256(f"{prev_hash}\n{body(seq, recorded_at, values)}".encode()).hexdigest()
        else:
            recomputed = row_hash(prev_hash, table, seq, recorded_at, dict(zip(names_of[table], values)))
        if recomputed != digest:
            found.append((pos, 2, f"{table} seq={seq}: content does not match its row_hash (edited behind the ledger)"))
        prev = seg.last_hash = digest
        if seq == want:
            seg.held = digest
    return seg


def join_segments(segments: Sequence[ChainSegment], expect: Head | None = None,
                  problems: Sequence[str] = ()) -> VerifyReport:
    """The report of the whole chain from its pieces in chain order, each piece's first link
    checked against the piece before it: the same report `verify_entries` makes of the chain."""
    want = expect.seq if expect is not None else None
    held = GENESIS if want == 0 else None
    found: list[tuple[int, int, str]] = []
    prev, count, last_at = GENESIS, 0, ""
    for seg in segments:
        if seg.first is not None:
            seq, table, first_prev = seg.first
            if not seg.linked and first_prev != prev:
                found.append((seg.start, 1, f"{table} seq={seq}: prev_hash does not match the row before it"))
            prev, last_at = seg.last_hash, seg.last_at
        count += seg.count
        found += seg.problems
        if seg.held is not None:
            held = seg.held
    out = list(problems) + [msg for _, _, msg in sorted(found, key=lambda x: (x[0], x[1]))]
    if expect is not None:
        if held is None:
            out.append(f"the published head seq={expect.seq} is gone: the chain ends at seq={count} "
                       "(truncated)")
        elif held != expect.row_hash:
            out.append(f"row seq={expect.seq} has hash {held[:16]}, the published head says "
                       f"{expect.row_hash[:16]} (rewritten up to the head)")
    return VerifyReport(rows=count, head_hash=prev, problems=tuple(out), head_seq=count, head_recorded_at=last_at)


def verify_entries(entries: Iterable[tuple[int, str, str, str, str, tuple]], expect: Head | None = None,
                   problems: Sequence[str] = ()) -> VerifyReport:
    """Recompute a chain read as `Ledger.chain_entries` gives it (any store; a list or a stream in
    seq order): name every row whose content or link does not match and, given a published head,
    a chain that no longer holds it."""
    want = expect.seq if expect is not None else None
    return join_segments([check_segment(entries, 1, want, GENESIS)], expect, problems)
