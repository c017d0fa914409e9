"""What the model remembers of the questions it was trained on: the window vectors
of the pages judged for each question (relevant or not), kept with the model.

Questionnaires repeat: the same CSR question reaches hundreds of suppliers, and the
analysts' verdicts on one supplier's pages say what the evidence looks like for the
next. For a query whose question is a remembered one (the same words), or else close to
remembered ones (cosine of the question vectors >= ``similarity`` and the same
figures: "scope 1" and "scope 3" questions are 0.97 apart in the bi-encoder but
ask for different evidence), four features of a page (``MEMORY_FEATURE_NAMES``):
whether a question matched, the page's best cosine with the pages judged relevant
for the matched questions, that minus its best cosine with the pages judged not
relevant, and the logit of the matched questions' probe: a linear classifier of
window vectors fitted, for each question with enough judged pages, on its relevant
against its not-relevant windows. The nearest page says how close this page is to one
remembered page; the probe weighs every judged page of the question and learns which
directions of the embedding tell its evidence from the report's other pages (the
other questions' evidence among them). A new question gets 0, 0, 0, 0 and the other
features decide.

The memory is fixed once the model is trained (it is a file of the model), so a page
still gets the same probability whatever pool it comes in. It keeps at most
``MAX_WINDOWS_PER_LABEL`` window vectors per question and verdict, the last in
training order (retraining puts the base data first and the analysts' verdicts
after it, so the newest evidence is what stays): months of feedback on a popular
question would otherwise grow the file and every match of it without bound, while
a few hundred pages already say what its evidence looks like.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

MEMORY_FEATURE_NAMES = (
    "memory_known",     # 1 when the question is close to one the model was trained on
    "memory_relevant",  # best cosine of the page's windows with pages judged relevant for it
    "memory_margin",    # that minus the best cosine with pages judged not relevant
    "memory_probe",     # best logit of the page's windows under the matched questions' probe (0 without one)
)
FILE_NAME = "question-memory.npz"
# Cosine of two questions' vectors above which they count as the same question:
# 0.8 and 0.95 gave the same cross-validated ranking (docs/BENCHMARKS.md, section 8c).
DEFAULT_SIMILARITY = 0.8
# 256 windows (about 128 pages) per question and verdict: 200 KB of float16 each;
# the shipped model's busiest question has 133 (docs/BENCHMARKS.md, section 8f).
MAX_WINDOWS_PER_LABEL = 256
# A question gets a probe when it has at least this many windows of each verdict:
# fewer say too little about which directions matter.
MIN_PROBE_WINDOWS = 8
# L2 strength of the probe (sklearn's C, its default).
PROBE_C = 1.0
# Bound on the probe's logit, so that a page far outside what a probe saw cannot
# outweigh every other feature.
PROBE_LOGIT_BOUND = 10.0


@dataclass(frozen=True)
class MemoryMatch:
    """The remembered pages of the questions a query matched, and their probe (the
    mean of the matched questions' probes; None when none of them has one)."""

    relevant: np.ndarray  # (rows, dim) window vectors
    not_relevant: np.ndarray  # (rows, dim)
    probe_weights: np.ndarray | None = None  # (dim,)
    probe_bias: float = 0.0

    def features(self, windows: np.ndarray) -> list[float]:
        if windows.size == 0:
            return [1.0, 0.0, 0.0, 0.0]
        best_relevant = float((windows @ self.relevant.T).max()) if len(self.relevant) else 0.0
        best_other = float((windows @ self.not_relevant.T).max()) if len(self.not_relevant) else 0.0
        probe = 0.0
        if self.probe_weights is not None:
            probe = float(np.clip((windows @ self.probe_weights).max() + self.probe_bias,
                                  -PROBE_LOGIT_BOUND, PROBE_LOGIT_BOUND))
        return [1.0, best_relevant, best_relevant - best_other, probe]


def fit_probes(vectors: np.ndarray, question_of: np.ndarray, relevant: np.ndarray, questions: int,
               min_windows: int = MIN_PROBE_WINDOWS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights (Q, dim), bias (Q,), has_probe (Q,)): for each question with at least
    ``min_windows`` windows of each verdict, an L2 logistic regression of its relevant
    against its not-relevant windows (deterministic: lbfgs from zero)."""
    from sklearn.linear_model import LogisticRegression

    dim = vectors.shape[1] if vectors.ndim == 2 else 0
    weights = np.zeros((questions, dim), dtype=np.float32)
    bias = np.zeros(questions, dtype=np.float32)
    has = np.zeros(questions, dtype=bool)
    for q in range(questions):
        rows = question_of == q
        labels = relevant[rows]
        if labels.sum() < min_windows or (~labels).sum() < min_windows:
            continue
        fit = LogisticRegression(C=PROBE_C, max_iter=2000).fit(vectors[rows].astype(np.float64), labels)
        weights[q], bias[q], has[q] = fit.coef_[0], fit.intercept_[0], True
    return weights, bias, has


def normalised_question(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def _figures(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"\d+(?:[.,]\d+)*", text))


@dataclass(frozen=True)
class QuestionMemory:
    questions: np.ndarray  # (Q, dim) question vectors, L2-normalised
    vectors: np.ndarray  # (R, dim) window vectors of the judged pages
    question_of: np.ndarray  # (R,) index into questions
    relevant: np.ndarray  # (R,) bool
    similarity: float = DEFAULT_SIMILARITY
    texts: tuple[str, ...] = ()  # the questions, normalised (normalised_question)
    probe_weights: np.ndarray | None = None  # (Q, dim): fit_probes; None in a memory saved before probes
    probe_bias: np.ndarray | None = None  # (Q,)
    has_probe: np.ndarray | None = None  # (Q,) bool

    @classmethod
    def build(cls, entries: Sequence[tuple[np.ndarray, np.ndarray, bool, str]],
              similarity: float = DEFAULT_SIMILARITY,
              max_windows_per_label: int = MAX_WINDOWS_PER_LABEL) -> "QuestionMemory":
        """``entries``: (question vector, the page's window vectors, relevant, question text),
        oldest first: past ``max_windows_per_label`` windows of one question and verdict,
        the earliest pages are left out."""
        # how many windows of each entry stay, counted from the newest
        room: dict[tuple[str, bool], int] = {}
        keep = [0] * len(entries)
        for i in range(len(entries) - 1, -1, -1):
            _vec, windows, relevant, question = entries[i]
            key = (normalised_question(question), bool(relevant))
            n = 0 if windows is None else len(windows)
            keep[i] = min(n, room.setdefault(key, max_windows_per_label))
            room[key] -= keep[i]
        index: dict[str, int] = {}
        questions, vectors, owner, labels = [], [], [], []
        for (question_vec, windows, relevant, question), n in zip(entries, keep):
            text = normalised_question(question)
            if text not in index:
                index[text] = len(questions)
                questions.append(np.asarray(question_vec, dtype=np.float32))
            if windows is None or windows.size == 0 or n == 0:
                continue
            windows = np.asarray(windows, dtype=np.float32)[len(windows) - n:]
            vectors.append(windows)
            owner += [index[text]] * len(windows)
            labels += [bool(relevant)] * len(windows)
        dim = len(questions[0]) if questions else 0
        vectors = np.vstack(vectors) if vectors else np.zeros((0, dim), np.float32)
        owner, labels = np.asarray(owner, dtype=np.int32), np.asarray(labels, dtype=bool)
        probes = fit_probes(vectors, owner, labels, len(questions))
        return cls(np.vstack(questions) if questions else np.zeros((0, dim), np.float32),
                   vectors, owner, labels, similarity, tuple(index), *probes)

    @property
    def size(self) -> int:
        return len(self.questions)

    def match(self, question_vec: np.ndarray, question: str) -> MemoryMatch | None:
        """The remembered pages of this question (asked with the same words), else of
        the questions close to it with the same figures; None for a new question."""
        if not len(self.questions) or self.questions.shape[1] != len(question_vec):
            return None
        text = normalised_question(question)
        if text in self.texts:
            close = np.asarray([self.texts.index(text)])
        else:
            figures = _figures(text)
            close = np.asarray([i for i in np.flatnonzero(self.questions @ question_vec >= self.similarity)
                                if _figures(self.texts[i]) == figures], dtype=int)
        if not len(close):
            return None
        rows = np.isin(self.question_of, close)
        probe_weights, probe_bias = None, 0.0
        if self.has_probe is not None:
            probed = close[self.has_probe[close]]
            if len(probed):
                probe_weights = self.probe_weights[probed].mean(axis=0)
                probe_bias = float(self.probe_bias[probed].mean())
        return MemoryMatch(self.vectors[rows & self.relevant], self.vectors[rows & ~self.relevant],
                           probe_weights, probe_bias)

    def save(self, directory: Path) -> Path:
        path = Path(directory) / FILE_NAME
        np.savez_compressed(path, questions=self.questions.astype(np.float16), vectors=self.vectors.astype(np.float16),
                            question_of=self.question_of, relevant=self.relevant,
                            similarity=np.asarray(self.similarity), texts=np.asarray(self.texts, dtype=str),
                            **({} if self.has_probe is None else
                               {"probe_weights": self.probe_weights.astype(np.float32),
                                "probe_bias": self.probe_bias.astype(np.float32), "has_probe": self.has_probe}))
        return path

    @classmethod
    def load(cls, directory: Path) -> "QuestionMemory | None":
        path = Path(directory) / FILE_NAME
        if not path.exists():
            return None
        with np.load(path) as data:
            probes = ((data["probe_weights"].astype(np.float32), data["probe_bias"].astype(np.float32),
                       data["has_probe"].astype(bool)) if "has_probe" in data else (None, None, None))
            return cls(data["questions"].astype(np.float32), data["vectors"].astype(np.float32),
                       data["question_of"].astype(np.int32), data["relevant"].astype(bool),
                       float(data["similarity"]), tuple(str(t) for t in data["texts"]), *probes)
