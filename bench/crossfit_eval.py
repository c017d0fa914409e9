"""Does the shipped recipe beat its first stage on companies it never saw? Every
labelled query, each scored by a model trained without its company.

The held-out split (training/splits/heldout.json) holds 27 financebench and 52
ClimRetrieve queries: a gain of one page in the top 3 of one query is 0.012 of P@3,
and the bootstrap intervals are as wide as the gains. This benchmark measures the
*recipe* (the README's `evidentia dataset` + `evidentia train --kind features`
commands, their defaults, the threshold each model chooses for itself) on every
labelled query instead: the companies of both domains are cut into folds (a company's
filings and reports fall in the same fold), a model is trained on the other folds with
the README's commands and evaluates its own fold with `evidentia eval`. The run files
of all folds are then pooled: paired bootstrap of the gains over the first stage,
ECE of the pools, and the share of R@3 and of the pool kept at each model's default t.

It does not measure the shipped model (docs/BENCHMARKS.md section 8 does, on the
held-out split); the fold models see the held-out queries of other folds.

With ``--cr-fold-by question`` the ClimRetrieve queries are cut by question instead
(financebench stays by company): a report question is scored by a model that never met
it, for any report, so the question memory cannot recall it: a new questionnaire
(docs/BENCHMARKS.md section 8m).

The shipped recipe's other records: ``--written-queries`` (the questions written and graded
on the training filings, ``bench/report_labels.py --training-filings``) are folded by
company with financebench, train the other folds and are scored in their own;
``--extra-records`` with ``--calibration-only-docs`` (the BHP reports' answered
questions) enter every fold's calibration; ``--threshold`` fixes every fold's t as the
README's train command does.

    export EVIDENTIA_DATA_DIR=/tmp/evd     # indexed as in the README's "shipped model" commands
    python bench/crossfit_eval.py --fb-queries ../shared/data/financebench-dev/queries.jsonl \
        --cr-queries /tmp/cr/train_queries.jsonl --cr-queries /tmp/cr/heldout_queries.jsonl \
        --written-queries written-filings.jsonl --extra-records train-bhp.jsonl --calibration-only-docs BHP_ \
        --threshold 0.09 --folds 5 --work /tmp/crossfit
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired_bootstrap import compare, per_query  # noqa: E402

from evidentia.config import Settings  # noqa: E402
from evidentia.evaluation.metrics import expected_calibration_error  # noqa: E402
from evidentia.training.dataset import DEFAULT_FOREIGN_NEGATIVES  # noqa: E402

DEFAULT_T = "hybrid+classifier@default"
CONFIGS = ("hybrid", "hybrid+cosine", "hybrid+classifier")
PAIRS = (("hybrid", "hybrid+classifier"), ("hybrid", DEFAULT_T), ("hybrid+cosine", "hybrid+classifier"))


def fold_of(key: str, folds: int, seed: int) -> int:
    digest = hashlib.sha256(f"crossfit:{seed}:{key.strip().lower()}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % folds


def question_key(question: str) -> str:
    """A question's first eight words: ClimRetrieve asks two near-copies ("Do the
    environmental/sustainability targets set by the company align with / reference
    external ... goals?", the same passages marked), which must share a fold, or the
    'new' question would be met in training under its twin's wording."""
    return " ".join(question.lower().split()[:8])


# Where each domain's queries come from: financebench ("fb"), ClimRetrieve ("cr") and the
# questions written on the training filings ("fw"), folded by company with financebench.
DOMAIN_NAMES = {"fb": "financebench", "cr": "ClimRetrieve", "fw": "written filing questions"}


def fold_key(query: dict, domain: str, cr_fold_by: str) -> str:
    return question_key(query["question"]) if domain == "cr" and cr_fold_by == "question" else query["company"]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def run(cmd: list[str], log: Path, env: dict | None = None) -> None:
    with log.open("a", encoding="utf-8") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}; see {log}")


def repeated(option: str, values) -> list[str]:
    """``option`` once before each value: a repeatable CLI option's arguments."""
    return [arg for value in values for arg in (option, value)]


def default_threshold(model: Path) -> float:
    """The t the model chose for itself; a model whose training pools allow none is used
    with the shipped default, as the reranker would."""
    chosen = json.loads((model / "evidentia-model.json").read_text(encoding="utf-8"))["metrics"].get("threshold")
    return chosen["t"] if chosen else Settings().classifier_threshold


def evaluate_at_default(queries: Path, model: Path, t: float, configs: tuple[str, ...], run_out: Path,
                        log: Path) -> None:
    """`evidentia eval` of ``configs`` and the model at ``t``; the thresholded run is named
    DEFAULT_T, whatever t each model chose, so that runs of several models pool."""
    env = {**os.environ, "EVIDENTIA_CLASSIFIER_MODEL": str(model)}
    run(["evidentia", "eval", "--queries", str(queries), "--compare", ",".join(configs) + f",hybrid+classifier@{t}",
         "--run-out", str(run_out), "--json"], log, env)
    rows = read_jsonl(run_out)
    for row in rows:
        if row["config"] == f"hybrid+classifier@{t}":
            row["config"] = DEFAULT_T
    write_jsonl(run_out, rows)


def train_and_evaluate(k: int, domains: dict[str, list[dict]], folds: int, seed: int, work: Path,
                       cr_fold_by: str = "company", foreign_negatives: int = DEFAULT_FOREIGN_NEGATIVES,
                       extra_records: tuple[Path, ...] = (), threshold_skip: tuple[str, ...] = (),
                       memory_family: tuple[str, ...] = (), memory_exclude: tuple[str, ...] = (),
                       calibration_only: tuple[str, ...] = (), threshold: float | None = None) -> float:
    """Fold k: the README's dataset and train commands on the other folds, eval on
    fold k. Returns the model's default threshold (``threshold`` when given, as the
    README's ``--threshold``). ``extra_records``: training records of documents outside
    the domains (the real reports' labels), in every fold; ``calibration_only``: their
    documents' prefixes, when they enter the calibration alone."""
    fold_dir = work / f"fold{k}"
    fold_dir.mkdir(parents=True, exist_ok=True)
    log = fold_dir / "log.txt"
    records = []
    for domain, queries in domains.items():
        train = [q for q in queries if fold_of(fold_key(q, domain, cr_fold_by), folds, seed) != k]
        test = [q for q in queries if fold_of(fold_key(q, domain, cr_fold_by), folds, seed) == k]
        write_jsonl(fold_dir / f"train-{domain}-queries.jsonl", train)
        write_jsonl(fold_dir / f"test-{domain}-queries.jsonl", test)
    for domain in domains:
        extra = ["--document-negatives", "200"] if domain == "cr" else []
        if domain == "fb" and foreign_negatives > 0:  # as the README: the training reports are the filings' foreign documents
            extra = ["--foreign-queries", str(fold_dir / "train-cr-queries.jsonl"),
                     "--foreign-negatives", str(foreign_negatives)]
        run(["evidentia", "dataset", "--queries", str(fold_dir / f"train-{domain}-queries.jsonl"), "--negatives", "20",
             "--stage", "hybrid", *extra, "--out", str(fold_dir / f"train-{domain}.jsonl")], log)
        records.append((fold_dir / f"train-{domain}.jsonl").read_text(encoding="utf-8"))
    records += [path.read_text(encoding="utf-8") for path in extra_records]
    (fold_dir / "train.jsonl").write_text("".join(records), encoding="utf-8")
    model = fold_dir / "model"
    run(["evidentia", "train", "--kind", "features", "--data", str(fold_dir / "train.jsonl"), "--out", str(model),
         *repeated("--threshold-skip-docs", ("CR_", *threshold_skip)),
         *repeated("--memory-family-docs", memory_family), *repeated("--memory-exclude-docs", memory_exclude),
         *repeated("--calibration-only-docs", calibration_only),
         *(["--threshold", str(threshold)] if threshold is not None else [])], log)
    t = default_threshold(model)
    env = {**os.environ, "EVIDENTIA_CLASSIFIER_MODEL": str(model)}
    for domain in domains:
        queries = fold_dir / f"test-{domain}-queries.jsonl"
        if not queries.read_text(encoding="utf-8").strip():
            continue
        evaluate_at_default(queries, model, t, CONFIGS, fold_dir / f"run-{domain}.jsonl", fold_dir / f"eval-{domain}.log")
    # the fold's filing questions in its reports and back: documents that cannot hold their evidence
    tests = [fold_dir / f"test-{domain}-queries.jsonl" for domain in ("fb", "cr")]
    if all(path.read_text(encoding="utf-8").strip() for path in tests):
        run([sys.executable, str(Path(__file__).resolve().parent / "foreign_documents.py"), "--queries", str(tests[0]),
             "--foreign-queries", str(tests[1]), "--model", str(model), "--threshold", str(t), "--json"],
            fold_dir / "foreign.json", env)
    return t


def pool_statistics(run_rows: list[dict], relevant: dict[str, set]) -> dict:
    """ECE of the unthresholded pools; R@3 and pool share kept by the default t."""
    probs, labels = [], []
    full, kept = {}, {}
    for row in run_rows:
        pages = [(p["doc_id"], p["page"]) for p in row["ranking"]]
        if row["config"] == "hybrid+classifier":
            probs += [p["probability"] for p in row["ranking"]]
            labels += [int(page in relevant[row["id"]]) for page in pages]
            full[row["id"]] = pages
        elif row["config"] == DEFAULT_T:
            kept[row["id"]] = pages

    def recall3(pages: list, rel: set) -> float:
        return len(set(pages[:3]) & rel) / len(rel)

    base = sum(recall3(full[q], relevant[q]) for q in full) / len(full)
    at_t = sum(recall3(kept.get(q, []), relevant[q]) for q in full) / len(full)
    return {"ECE": expected_calibration_error(probs, labels), "pages": len(probs), "relevant": sum(labels),
            "mean_p": sum(probs) / len(probs), "R@3 kept": at_t / base if base else 0.0,
            "pool share": sum(len(kept.get(q, [])) for q in full) / len(probs)}


# The field a domain's gain is broken down by: a mean over all queries hides that the
# classifier wins financebench's figure questions and loses those that need reasoning
# (docs/BENCHMARKS.md section 8q), or that it helps on one layout of the reports only.
BREAKDOWN = {"fb": "question_type", "cr": "layout", "fw": "question_type"}


def print_breakdown(scores: dict, queries: list[dict], field: str, samples: int, seed: int) -> None:
    """The gain over hybrid per value of ``field`` (BREAKDOWN), with its paired bootstrap interval."""
    groups: dict[str, list[str]] = {}
    for q in queries:
        if q.get(field) and q["id"] in scores["hybrid"]:
            groups.setdefault(q[field], []).append(q["id"])
    for kind, ids in sorted(groups.items()):
        line = []
        for metric, col in (("P@1", 2), ("P@3", 0)):
            a = [scores["hybrid"][q][col] for q in ids]
            b = [scores["hybrid+classifier"][q][col] for q in ids]
            c = compare(a, b, samples, seed)
            line.append(f"{metric} {sum(a) / len(ids):.3f} -> {sum(b) / len(ids):.3f} "
                        f"[{c['low']:+.3f}, {c['high']:+.3f}] ({c['better']} better / {c['worse']} worse)")
        print(f"  {kind} ({len(ids)} q), hybrid -> hybrid+classifier: " + "; ".join(line))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fb-queries", type=Path, required=True, help="financebench queries (with 'company')")
    ap.add_argument("--cr-queries", type=Path, action="append", required=True,
                    help="ClimRetrieve queries of bench/climretrieve_pools.py (repeatable)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--samples", type=int, default=10000)
    ap.add_argument("--cr-fold-by", choices=("company", "question"), default="company",
                    help="question: every ClimRetrieve query is scored by a model that never met its question "
                         "(for any report): the question memory cannot help, as with a new questionnaire")
    ap.add_argument("--foreign-negatives", type=int, default=DEFAULT_FOREIGN_NEGATIVES,
                    help="the financebench records' foreign-document negatives per query (0: none)")
    ap.add_argument("--written-queries", type=Path, action="append", default=[],
                    help="labelled questions written on training filings (bench/report_labels.py --training-filings): "
                         "folded by company with financebench (repeatable)")
    ap.add_argument("--extra-records", type=Path, action="append", default=[],
                    help="training records added to every fold (documents of neither domain; repeatable)")
    ap.add_argument("--threshold-skip-docs", action="append", default=[],
                    help="documents whose pools do not choose a fold's t, besides CR_ (repeatable)")
    ap.add_argument("--memory-family-docs", action="append", default=[],
                    help="documents that share a memory fold in training (one company's reports; repeatable)")
    ap.add_argument("--memory-exclude-docs", action="append", default=[],
                    help="documents kept out of the question memory in training (repeatable)")
    ap.add_argument("--calibration-only-docs", action="append", default=[],
                    help="documents whose records enter the calibration alone (the extra records'; repeatable)")
    ap.add_argument("--threshold", type=float, default=None,
                    help="every fold's t, as the README's train command (default: each model's own choice)")
    args = ap.parse_args()
    domains = {"fb": read_jsonl(args.fb_queries), "cr": [q for f in args.cr_queries for q in read_jsonl(f)]}
    if args.written_queries:
        domains["fw"] = [q for f in args.written_queries for q in read_jsonl(f)]
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    thresholds = []
    for k in range(args.folds):
        thresholds.append(train_and_evaluate(k, domains, args.folds, args.seed, args.work, args.cr_fold_by,
                                             args.foreign_negatives, tuple(args.extra_records),
                                             tuple(args.threshold_skip_docs), tuple(args.memory_family_docs),
                                             tuple(args.memory_exclude_docs), tuple(args.calibration_only_docs),
                                             args.threshold))
        print(f"fold {k + 1}/{args.folds}: default t {thresholds[-1]} ({time.perf_counter() - t0:.0f} s)", flush=True)
    whose_t = "every fold's t (--threshold)" if args.threshold is not None else "each model's own default t"
    print(f"\ncross-fitted by company (ClimRetrieve by {args.cr_fold_by}), {args.folds} folds (seed {args.seed}); "
          f"{whose_t}: " + ", ".join(str(t) for t in thresholds) + f"; load {os.getloadavg()[0]:.1f}")
    for domain, queries in domains.items():
        runs = args.work / f"run-{domain}.jsonl"
        rows = [row for k in range(args.folds) if (args.work / f"fold{k}" / f"run-{domain}.jsonl").exists()
                for row in read_jsonl(args.work / f"fold{k}" / f"run-{domain}.jsonl")]
        write_jsonl(runs, rows)
        pooled_queries = args.work / f"queries-{domain}.jsonl"
        write_jsonl(pooled_queries, queries)
        scores = per_query(runs, pooled_queries)
        ids = sorted(scores["hybrid"])
        print(f"\n{domain} ({DOMAIN_NAMES[domain]}): {len(ids)} queries")
        print("  " + " | ".join(f"{c}: P@1 {sum(scores[c][q][2] for q in ids) / len(ids):.3f} "
                                f"P@3 {sum(scores[c][q][0] for q in ids) / len(ids):.3f} "
                                f"R@3 {sum(scores[c][q][1] for q in ids) / len(ids):.3f}"
                                for c in (*CONFIGS, DEFAULT_T)))
        for a, b in PAIRS:
            for metric, col in (("P@1", 2), ("P@3", 0)):
                c = compare([scores[a][q][col] for q in ids], [scores[b][q][col] for q in ids], args.samples,
                            args.seed)
                print(f"  {b} - {a} {metric}: {c['difference']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}] "
                      f"({c['better']} better / {c['worse']} worse)")
        print_breakdown(scores, queries, BREAKDOWN[domain], args.samples, args.seed)
        relevant = {q["id"]: {(q["doc_id"], p) for p in q["relevant_pages"]} for q in queries}
        stats = pool_statistics(rows, relevant)
        print(f"  pools: {stats['pages']} pages, {stats['relevant']} relevant, mean p {stats['mean_p']:.3f}, "
              f"ECE {stats['ECE']:.3f}; at the default t: {stats['R@3 kept']:.0%} of R@3 kept, "
              f"{stats['pool share']:.0%} of the pool returned")
    foreign = [json.loads(lines[-1]) for k in range(args.folds)
               if (path := args.work / f"fold{k}" / "foreign.json").exists()
               and (lines := path.read_text(encoding="utf-8").strip().splitlines())]
    if foreign:
        print(f"\nfilings' questions in the fold's reports and back ({len(foreign)} folds, each at its own t; "
              "bench/foreign_documents.py):")
        for key, label in (("queries: own documents", "filing questions, own filing"),
                           ("queries: foreign documents", "filing questions, a climate report"),
                           ("foreign: own documents", "report questions, own report"),
                           ("foreign: foreign documents", "report questions, a filing")):
            rows = [f[key] for f in foreign]
            n = sum(r["pools"] for r in rows)
            mean_best = sum(r["best_p_mean"] * r["pools"] for r in rows) / n
            keeping = sum(r["pools_keeping_a_page"] * r["pools"] for r in rows) / n
            print(f"  {label}: {n} pools, best p mean {mean_best:.3f}, max {max(r['best_p_max'] for r in rows):.3f}; "
                  f"{keeping:.0%} keep a page at t")


if __name__ == "__main__":
    main()
