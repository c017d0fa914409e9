"""``evidentia eval``: offline evaluation of retrieval configurations on a queries file.

Only typer is imported at module level: this module is loaded whenever the
``evidentia`` command starts, and `evidentia --help` must stay fast. The runner,
scikit-learn and matplotlib are imported when the command runs. Nor is
``evidentia.cli`` imported here at module level, since it imports this module.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer

COMPARE_HELP = ("Comma-separated configurations to compare, each [stage+]reranker[@threshold], "
                "e.g. 'bm25,hybrid,hybrid+classifier,hybrid+classifier@0.1'. A bare stage (bm25) means no "
                "reranker; a bare reranker runs on bm25 (write hybrid+ for the search default); a classifier "
                "without @t ranks every page, no threshold (`evidentia search` applies "
                "EVIDENTIA_CLASSIFIER_THRESHOLD). Default: what `evidentia search` runs without options "
                "(EVIDENTIA_STAGE, EVIDENTIA_DEFAULT_RERANKER and its threshold).")


def parse_ks(spec: str) -> list[int]:
    ks: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            k = int(part)
        except ValueError:
            raise ValueError(f"--k: {part!r} is not an integer") from None
        if k < 1:
            raise ValueError(f"--k: {k} is not a positive integer")
        if k not in ks:
            ks.append(k)
    if not ks:
        raise ValueError("--k names no cut-off (e.g. --k 1,3)")
    return ks


def refuse_pages_beyond_documents(queries_file: Path, queries, engine) -> None:
    """Labelled pages past the end of their document: an error (exit 1) for every command
    that reads labelled queries (eval, dataset, calibrate)."""
    from evidentia.console import EXIT_BAD_INPUT, fail
    from evidentia.evaluation.runner import pages_beyond_documents

    beyond = pages_beyond_documents(queries, engine)
    if beyond:
        raise fail(f"{queries_file}: {beyond}", EXIT_BAD_INPUT)


def fallback_warnings(config_runs) -> list[str]:
    """One line per reranking pass whose reranker fell back to the first-stage order
    on some queries: its column then scores that order, not the reranker's."""
    from collections import Counter

    from evidentia.reranker.llm_runtime import FALLBACK_SUFFIX

    lines, seen = [], set()
    for c in config_runs:
        reasons = Counter(run.fallback_reason.removesuffix(FALLBACK_SUFFIX) for run in c.runs if run.fallback)
        if not reasons or c.pass_key in seen:
            continue
        seen.add(c.pass_key)
        reason, count = reasons.most_common(1)[0]
        others = f" (and {len(reasons) - 1} other reason(s))" if len(reasons) > 1 else ""
        lines.append(f"{c.label} fell back to the {c.config.stage} order on {sum(reasons.values())} of {len(c.runs)} "
                     f"queries, which its column scores: {reason}{others}")
    return lines


def run_lines(config_runs) -> list[str]:
    """One JSON line per query and configuration: the ranking exactly as scored, best first."""
    from evidentia.text import json_line

    lines = []
    for c in config_runs:
        for run in c.runs:
            ranking = []
            for p in run.pages:
                item = {"doc_id": p.doc_id, "page": p.page, "score": p.score}
                if p.probability is not None:
                    item["probability"] = p.probability
                ranking.append(item)
            lines.append(json_line({"config": c.label, "id": run.query.id, "ranking": ranking}))
    return lines


def check_shorthand(reranker: str, threshold: Optional[float]) -> None:
    """Fail (exit 2) where --reranker or --threshold cannot make a configuration."""
    from evidentia.console import fail
    from evidentia.reranker.registry import reranker_class, reranker_names

    if reranker not in reranker_names():
        raise fail(f"--reranker: unknown reranker {reranker!r}; choose one of {', '.join(reranker_names())}")
    if threshold is None:
        return
    if not 0.0 <= threshold <= 1.0:  # NaN too
        raise fail("--threshold must be between 0 and 1")
    if not reranker_class(reranker).outputs_probabilities:
        raise fail(f"--threshold: reranker {reranker!r} does not output probabilities, so it takes no threshold")


def eval_command(
    queries: Path = typer.Option(..., "--queries", help="Queries JSONL: id, doc_id (or doc_ids), question, answer, "
                                 "relevant_pages (1-based), optional extra fields such as question_type."),
    pdf_dir: Optional[Path] = typer.Option(None, "--pdf-dir", help="Folder of the queries' PDFs, each found by its "
                                           "document id (the file name as `evidentia index` makes it): those not "
                                           "indexed yet are indexed from it first."),
    compare: Optional[str] = typer.Option(None, "--compare", help=COMPARE_HELP),
    reranker: Optional[str] = typer.Option(None, "--reranker", help="Shorthand for one configuration: the stage "
                                           "`evidentia search` runs (EVIDENTIA_STAGE) + this reranker (none, llm, "
                                           "classifier, cosine); replaces --compare."),
    threshold: Optional[float] = typer.Option(None, "--threshold", help="With --reranker classifier: the "
                                              "probability threshold t (default: none, every page ranked)."),
    k: str = typer.Option("1,3", "--k", help="Cut-offs of P@k and R@k, comma-separated."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (all metrics per configuration and category)."),
    run_out: Optional[Path] = typer.Option(None, "--run-out", help="Write one JSON line per query and configuration "
                                           "with the ranking that was scored."),
    report: Optional[Path] = typer.Option(None, "--report", help="Write PNG plots and a self-contained index.html "
                                          "into this folder."),
    pool_size: Optional[int] = typer.Option(None, "--pool-size", help="First-stage candidate pool per query "
                                            "(default EVIDENTIA_POOL_SIZE, 20)."),
):
    """Evaluate configurations against queries with known relevant pages (P@k, R@k, MRR, nDCG, MAP, calibration)."""
    from evidentia.console import EXIT_BACKEND, EXIT_BAD_INPUT, Context, fail  # fail(): EXIT_USAGE
    from evidentia.config import ConfigError
    from evidentia.evaluation.queries import QueriesFileError, load_queries
    from evidentia.evaluation.runner import UnknownDocumentsError, all_doc_ids, parse_compare, run_configs, summarize
    from evidentia.retriever.base import BackendError, UnknownDocumentError

    try:
        ks = parse_ks(k)
    except ValueError as exc:
        raise fail(str(exc))
    if pool_size is not None and pool_size <= 0:
        raise fail("--pool-size must be a positive integer")
    if pdf_dir is not None and not pdf_dir.is_dir():
        raise fail(f"--pdf-dir {pdf_dir}: no such folder")
    check_outputs(run_out, report)  # before the run, which may take many minutes
    ctx = Context(batch=True)
    try:
        searched = ctx.engine.config()  # what `evidentia search` runs without options
    except ConfigError:
        searched = None
    # the defaults a search gets: `eval --reranker classifier` measured bm25+classifier where
    # `search --reranker classifier` ran hybrid, and a newcomer took one for the other
    stage = searched.stage if searched is not None else "bm25"
    explicit = compare is not None
    if reranker is not None:
        # checked here, each problem named by its flag: parse_compare's messages quote the
        # configuration the shorthand makes ('hybrid+classifier@1.5'), which the user never wrote
        check_shorthand(reranker, threshold)
        compare = stage if reranker == "none" else f"{stage}+{reranker}"
        if threshold is not None:
            compare += f"@{threshold:g}"
    elif threshold is not None:
        raise fail("--threshold goes with --reranker (or write it in --compare, e.g. classifier@0.15)")
    elif compare is None:
        compare = searched.label if searched is not None else "bm25"
    try:
        configs = parse_compare(compare)
    except ConfigError as exc:
        raise fail(f"--compare: {exc}")
    try:
        items = load_queries(queries)
    except QueriesFileError as exc:
        raise fail(str(exc), EXIT_BAD_INPUT)

    pool = pool_size or ctx.settings.pool_size
    if explicit and searched is not None and all((c.stage, c.reranker, c.threshold) != (searched.stage, searched.reranker,
                                                                          searched.threshold) for c in configs):
        typer.echo(f"note: `evidentia search` runs {searched.label} by default, which is not among these; "
                   f"add it to --compare to measure what a search returns", err=True)
    try:
        ctx.require_documents(all_doc_ids(items), [pdf_dir] if pdf_dir else [],
                              lambda missing: str(UnknownDocumentsError(missing, pdf_dir)))
        refuse_pages_beyond_documents(queries, items, ctx.engine)
        config_runs = run_configs(items, configs, ctx.engine, pool_size=pool)
    except ConfigError as exc:
        raise fail(str(exc))
    except UnknownDocumentError as exc:
        raise fail(f"{exc}; `evidentia docs` lists the indexed ones", EXIT_BAD_INPUT)
    except BackendError as exc:
        raise fail(str(exc), EXIT_BACKEND)

    for warning in fallback_warnings(config_runs):
        typer.echo(f"warning: {warning}", err=True)
    result = summarize(config_runs, items, ks, pool)

    if run_out is not None:
        try:
            run_out.parent.mkdir(parents=True, exist_ok=True)
            run_out.write_text("".join(line + "\n" for line in run_lines(config_runs)), encoding="utf-8")
        except OSError as exc:
            raise fail(f"--run-out {run_out}: {exc.strerror or exc}", EXIT_BAD_INPUT)
    if report is not None:
        from evidentia.evaluation.report import write_report

        try:
            index = write_report(report, result, config_runs, source=str(queries))
        except OSError as exc:
            raise fail(f"--report {report}: {exc.strerror or exc}", EXIT_BAD_INPUT)
        typer.echo(f"report written to {index}", err=True)

    if as_json:
        typer.echo(json.dumps(result, ensure_ascii=False))
        return
    typer.echo(format_text(result))


def format_text(result: dict) -> str:
    from evidentia.evaluation import tables

    out = [tables.render_text(tables.main_table(result))]
    out.extend(tables.notes(result))
    for name in result["categories"]:
        out.append("")
        out.append(tables.render_text(tables.category_table(result, name), title=f"By {name}:"))
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(typer.run(eval_command))


def check_outputs(run_out: Path | None, report: Path | None) -> None:
    """Fail at once (exit 1) where --run-out or --report cannot be written: a typo in
    either was found only after a run of minutes. The report's folder is made now."""
    from evidentia.console import EXIT_BAD_INPUT, fail

    if run_out is not None:
        if run_out.is_dir():
            raise fail(f"--run-out {run_out} is a folder: give a file name (one JSON line per query)", EXIT_BAD_INPUT)
        try:
            run_out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise fail(f"--run-out {run_out}: {exc.strerror or exc}", EXIT_BAD_INPUT)
        if not os.access(run_out.parent, os.W_OK) or (run_out.exists() and not os.access(run_out, os.W_OK)):
            raise fail(f"--run-out {run_out}: not writable", EXIT_BAD_INPUT)
    if report is not None:
        if report.exists() and not report.is_dir():
            raise fail(f"--report {report} is a file: give a folder (the report is index.html and its plots)",
                       EXIT_BAD_INPUT)
        try:
            report.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise fail(f"--report {report}: {exc.strerror or exc}", EXIT_BAD_INPUT)
        if not os.access(report, os.W_OK):
            raise fail(f"--report {report}: not writable", EXIT_BAD_INPUT)
