"""`python -m tfwebhook`: run the service with settings from the environment (as `tfctl serve` does)."""

from tfwebhook.app import main

raise SystemExit(main())
