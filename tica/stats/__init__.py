"""Statistics behind decidable acceptance (issue 12): the frozen bases, their tests, and plans.

Pure functions over numbers (numpy, scipy.stats); no Dagster. `bases` holds the frozen models
(no scipy: every question parse imports them); `throughput` decides a budget per concurrency
with the exact sign test on the median per-round paired loss; `quality` decides a score
threshold with exact binomial (McNemar) bounds on the discordant pairs; `plan` sizes a basis
from a pilot's legs, read as the judges read them; `plots` draws. docs/statistics.md says why
these tests, and what the simulations show.
"""

from tica.stats.bases import QualityBasis, ThroughputBasis

__all__ = ["QualityBasis", "ThroughputBasis"]
