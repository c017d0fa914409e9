"""Write ClimRetrieve's labelled pools as PDFs + queries (evaluation/climretrieve.py):
one generated PDF per report and layout (``passage``: one page per expert-marked
passage, document CR_<report>; ``printed``: a cover, then one page per printed
page the experts cited, holding its passages, document CR_<report>_printed) and
train_queries.jsonl / heldout_queries.jsonl split by training/splits/heldout.json
(each query names its layout).

Usage: python bench/climretrieve_pools.py --out /tmp/cr [--layout passage --layout printed] [--data ../shared/data/climretrieve-train]
Then: EVIDENTIA_DATA_DIR=... evidentia index /tmp/cr/pdfs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evidentia.evaluation.climretrieve import LAYOUTS, write_pools


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/climretrieve-train")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layout", choices=LAYOUTS, action="append",
                    help="how the passages make pages, repeatable (default: every layout, as the shipped model)")
    args = ap.parse_args()
    counts = write_pools(args.data / "passages.jsonl", args.out, args.data / "question_definitions.jsonl",
                         layouts=args.layout or LAYOUTS)
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
