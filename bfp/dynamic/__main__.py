"""``python -m bfp.dynamic plot RUN_DIR``: the command lives in ``report.main``."""
import sys

from .report import main

if __name__ == "__main__":
    sys.exit(main())
