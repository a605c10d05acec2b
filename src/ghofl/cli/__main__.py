"""``python -m ghofl.cli`` runs the ``ghofl`` command."""

import sys

from ghofl.cli.main import main

sys.exit(main())
