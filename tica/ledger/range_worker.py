"""One range of a parallel verify, in a process of its own: `python -m tica.ledger.range_worker KIND
JOB` (tica.ledger.parallel starts it and reads the range's segment, JSON, from its stdout). A module
of its own, outside the package's __init__, so that running it imports tica.ledger.parallel once."""

from __future__ import annotations

import sys

from tica.ledger.parallel import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
