"""``python -m pallas_conformance`` is the ``pallas-conformance`` CLI."""

import sys

from pallas_conformance.cli import main

sys.exit(main())
