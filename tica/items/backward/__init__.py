"""The module backward, in one room: `criteria` (what a question freezes), `judge` (gradients
finite and reaching the master weights, a recorded gradient check judged, a BI=1 leg ran),
`canaries` (a passing receipt set and one planted error per rule), `legs` (the legs a question
calls for). Its receipts are tica.receipts' BackwardStep rows and a gradcheck.json; reading a
trainer's gradients and its gradient check (tica.grad_reading) is core, shared with the update.
Its producer is tica/legs/backward.py."""
