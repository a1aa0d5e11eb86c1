"""``python -m notifier.cli``: the ``notifier`` command."""

import sys

from notifier.cli.main import main

sys.exit(main())
