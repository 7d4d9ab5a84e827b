"""``python -m charter`` runs the command line."""

from charter.cli.app import main

raise SystemExit(main())
