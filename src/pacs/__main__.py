"""`python -m pacs ...`: the `pacs` command line (`pacs.cli`)."""

import sys

from pacs.cli import main


if __name__ == "__main__":
    sys.exit(main())
