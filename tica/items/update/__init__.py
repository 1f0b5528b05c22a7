"""The real update, in one room: `criteria` (what a question freezes), `judge` (one optimizer step,
weight sync to the rollout engine, the forward re-checked on the updated weights), `canaries` (a
passing receipt set and one planted error per rule), `legs` (the legs a question calls for),
`receipts` (where its post-update forward lies). Its receipts are tica.receipts' UpdateStep rows
and a post_forward/ forward receipt; reading a forward
receipt (tica.forward_reading) and a trainer's gradients (tica.grad_reading) is core, shared with
the forward and backward judges. Its producer is tica/legs/update.py."""
