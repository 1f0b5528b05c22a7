"""TICA's Dagster layer: a thin skin over the pure core in `tica`.

`definitions.py` only gathers; each domain module (candidates, evidence, checks, report, jobs)
ends in a function that returns its own `Definitions` for one candidate track.
"""
