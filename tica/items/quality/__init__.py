"""Quality, in one room: `criteria` (what a question freezes), `judge` (the two arms' scores on
the same problems under the same evaluation contract, paired per problem), `canaries` (a passing
receipt set and one planted error per rule), `legs` (the legs a question calls for), `receipts`
(its leg's contract.json, as the judge reads it). The models of its receipts are tica.receipts'
per-problem results and recorded evaluation contract (ingest writes through them); the threshold's
statistical decision is core (tica.stats.quality), and its 2x2 recount is the `quality_sums`
check (tica.checks). Its producer is tica/legs/quality.py."""
