"""`python -m tfmetrics`: run the service with settings from the environment (as `tfctl serve` does)."""

from tfmetrics.app import main

raise SystemExit(main())
