"""Write ClimRetrieve's labelled pools as PDFs + queries (evaluation/climretrieve.py):
one generated PDF per report (one page per expert-marked passage) and
train_queries.jsonl / heldout_queries.jsonl split by training/splits/heldout.json.

Usage: python bench/climretrieve_pools.py --out /tmp/cr [--data ../shared/data/climretrieve-train]
Then: EVIDENTIA_DATA_DIR=... evidentia index /tmp/cr/pdfs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evidentia.evaluation.climretrieve import write_pools


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/climretrieve-train")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    counts = write_pools(args.data / "passages.jsonl", args.out, args.data / "question_definitions.jsonl")
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
