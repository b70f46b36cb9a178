"""`python -m tfcommon.nats_auth [serve|issuer|node-token NODE]` (`tfcommon.nats_auth.callout.main`)."""

import sys

from tfcommon.nats_auth.callout import main

sys.exit(main())
