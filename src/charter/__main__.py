"""``python -m charter`` runs the command line."""

from charter.cli import main

raise SystemExit(main())
