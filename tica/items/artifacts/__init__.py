"""Final immutable artifacts, in one room: `criteria` (what a question freezes), `judge` (every
receipt sealed and unchanged, weights named by content hash), `canaries` (a passing receipt set
and one planted error per rule), `legs` (none: the artifacts are the other items' sealed legs).
Its receipts are those legs' seals (tica.seal) and their leg.json (tica.receipts): both core."""
