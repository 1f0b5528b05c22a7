"""Every name TICA takes from Dagster's private namespace (`dagster._…`), in one place: each has no
public equivalent in Dagster 1.13, and a Dagster upgrade that moves one breaks here, by name.
tests/core/test_dagster_private.py keeps every other module to Dagster's public names. Here in
`resources`, the lowest Dagster layer, so the assets, sensors and resources can all import it.
"""

from __future__ import annotations

# What PipesSubprocessClient.run raises when the child fails (a non-zero exit, a Pipes error);
# Dagster exports only the base DagsterPipesError from dagster_pipes, which is not its parent.
from dagster._core.errors import DagsterPipesExecutionError

# The tag an AssetObservation carries its data version in: a sensor's observation of a source asset
# can be given a data version only through it (ObserveResult's data_version needs an observation run).
from dagster._core.definitions.data_version import DATA_VERSION_TAG

# How a Pipes reader hands one log line to Dagster (a Pipes message, or the line to stdout): what
# dagster-ray's Ray job reader calls for each line it tails; TICA's reader drains a finished job's log with it.
from dagster._core.pipes.utils import extract_message_or_forward_to_stdout

__all__ = ["DATA_VERSION_TAG", "DagsterPipesExecutionError", "extract_message_or_forward_to_stdout"]
