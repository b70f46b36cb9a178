"""`python -m tfscheduler`: run the service with settings from the environment (as `tfctl serve` does)."""

from tfscheduler.app import main

raise SystemExit(main())
