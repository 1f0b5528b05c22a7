"""`python -m tica.cli`: the `tica` command."""

from tica.cli import main

raise SystemExit(main())
