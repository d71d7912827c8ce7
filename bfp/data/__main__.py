"""``python -m bfp.data prepare cifar10 --from cifar-10-python.tar.gz --out data/cifar10_jpg``:
the JPEG CIFAR-10 class folders the experiment tables train on, made from the archive the
CIFAR-10 site publishes (``bfp.data.prepare``)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from .archives import ArchiveError
from .prepare import prepare_cifar10


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bfp.data", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["prepare"])
    p.add_argument("dataset", choices=["cifar10"])
    p.add_argument("--from", dest="source", required=True, metavar="ARCHIVE",
                   help="cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html "
                        "(as torchvision downloads it)")
    p.add_argument("--out", default="data/cifar10_jpg", help="the folder to write (must not exist)")
    p.add_argument("--progress", default="True", choices=["True", "False"], help="tqdm progress bars")
    args = p.parse_args(argv)
    try:
        counts = prepare_cifar10(Path(args.source), Path(args.out), progress=args.progress == "True")
    except ArchiveError as e:
        print(f"python -m bfp.data: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {counts['train']} training and {counts['test']} test images "
          f"(train/<class>/, test/<class>/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
