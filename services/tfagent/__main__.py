"""`python -m tfagent`: run the service with settings from the environment (as `tfctl serve` does)."""

from tfagent.app import main

raise SystemExit(main())
