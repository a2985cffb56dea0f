"""`python -m workwarden` runs the command line."""

from workwarden.cli import main

raise SystemExit(main())
