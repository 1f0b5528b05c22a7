"""Throughput, in one room: `criteria` (what a question freezes: the workload, the formula and its
budget per concurrency, the tier ratio, the statistical basis), `judge` (exit and workload receipts
first, the crossed order of every round, per-round loss, the frozen statistic per concurrency),
`tiers` (what the fast and slow legs of a tiered arm ran under), `canaries` (a passing receipt set
and one planted error per rule), `legs` (the crossed rounds a question calls for). Its receipts are
`vllm bench serve` results beside a leg.json (tica.receipts' BenchLeg); one process's exit rule
(tica.process_exits), the crossed pairing (tica.pairing) and the budget's statistical decision
(tica.stats.throughput) are core, and its workload check against the candidate is the
`workload_receipts` check (tica.checks). `tica plan throughput` (tica.stats.plan) reads pilot legs
with this judge's readers. Its producer is tica/legs/throughput.py."""
