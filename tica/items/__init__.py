"""The evidence items, one room each (tica/items/<item>/): its criteria, judge, canaries and leg
plan side by side. `tica.items.registry` names, for every item, where each of those pieces lives
(in its room, or in the older shared modules for the items not moved yet); the judges' entry
point, the canary table, the checks, the leg runners, the command line and the Dagster assets
read it. No room imports another (pyproject.toml's import contracts); what two items share lives
in the core. This package imports nothing, so a room's modules load on their own."""
