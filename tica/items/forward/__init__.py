"""The train–inference forward, in one room: `criteria` (what a question freezes), `judge` (BI=1
bitwise at every step, BI=0 of the reference's magnitude, the arms a question judges), `canaries`
(a passing receipt set and one planted error per rule), `legs` (the legs a question calls for).
Its receipts are tica.receipts' ForwardStep rows and step arrays; reading one forward receipt
(tica.forward_reading) is core, shared with the update's post-update re-check, and the
confounder table (tica.confounders) is core too. Its producer is tica/legs/forward.py."""
