"""Cost of parsing hostile LLM answers (reranker/llm.py ``parse_answer``): every
answer must end as a MalformedAnswer (or a ranking) in time linear in its length.

    python bench/bench_llm_parser.py
"""

from __future__ import annotations

import time

from evidentia.reranker.llm import ANSWER_KEY, MalformedAnswer, parse_answer

KEY = '{"' + ANSWER_KEY + '": '
ANSWERS = {
    "normal answer": KEY + "[3, 1, 7]}",
    "'{\"a\":' * 5000 (RecursionError before)": '{"a":' * 5000,
    "same, closed": '{"a":' * 5000 + "1" + "}" * 5000,
    "60 KB of '{'": "{" * 60000,
    "60 KB of '{\"'": '{"' * 30000,
    "60 KB of small objects without the key": '{"b": 1} ' * 7000,
    "list nested 20,000 deep": KEY + "[" * 20000 + "]" * 20000 + "}",
    "3 MB list (the issue's 39 s case)": KEY + "[" + "1, " * 1_000_000 + "1]}",
    "10 MB of '{['": "{[" * 5_000_000,
}


def main() -> None:
    print(f"{'answer':45s} {'chars':>10s} {'ms':>8s}  outcome")
    for name, text in ANSWERS.items():
        t0 = time.perf_counter()
        try:
            outcome = f"pages {parse_answer(text, 10)}"
        except MalformedAnswer as exc:
            outcome = f"malformed: {exc}"
        ms = (time.perf_counter() - t0) * 1000
        print(f"{name:45s} {len(text):10d} {ms:8.1f}  {outcome}")


if __name__ == "__main__":
    main()
