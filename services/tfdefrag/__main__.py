"""`python -m tfdefrag`: run the service with settings from the environment (as `tfctl serve` does)."""

from tfdefrag.app import main

raise SystemExit(main())
