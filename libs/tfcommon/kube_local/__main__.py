"""`python -m tfcommon.kube_local` (what `make kubernetes` runs): build the pinned control plane if needed."""

import sys

from tfcommon.kube_local.build import main

sys.exit(main())
