"""``python3 -m tandem``: the tandem CLI."""
import sys

from tandem.cli import main

sys.exit(main())
