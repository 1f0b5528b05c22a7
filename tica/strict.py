"""The base of every frozen, closed input model (criteria and the like): no unknown field, no
mutation, and numbers finite, since a NaN budget can never fail and an infinite one never be
exceeded."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
