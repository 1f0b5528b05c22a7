"""The update's own receipt layout: the folder of its post-update forward re-check.

Its step rows' model (`UpdateStep`, with `UpdateRerun`) stays in the core (tica.receipts): it
extends the backward's `BackwardStep`, and the schema command exports it under that module's name
(docs/schemas/update-step.schema.json). What only this room reads lives here.
"""

# In an update leg: the forward re-checked on the updated weights, a forward receipt of its own
# (metrics.jsonl and arrays/, read by tica.forward_reading).
POST_FORWARD_DIR = "post_forward"
