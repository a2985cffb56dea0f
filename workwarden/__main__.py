"""`python -m workwarden` runs the command line."""

from workwarden._launch import main

raise SystemExit(main())
