"""``python -m deep_sleep.cli``."""

import sys

from deep_sleep.cli import main

if __name__ == "__main__":
    sys.exit(main())
