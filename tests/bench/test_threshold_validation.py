"""bench/threshold_validation.py: the lowest t that meets both threshold goals in every
kind of document."""

from tests.utils.bench import bench_module


def _module():
    return bench_module("threshold_validation")


def _filing(i: int):
    """One relevant page at 0.6, nineteen others at 0.02: a filing's pool."""
    return [0.6] + [0.02] * 19, [1] + [0] * 19


def _report(i: int):
    """Two relevant pages at 0.5 and 0.3, ten on-topic pages at 0.2, eight at 0.05."""
    return [0.5, 0.3] + [0.2] * 10 + [0.05] * 8, [1, 1] + [0] * 18


def test_each_kind_of_document_gets_its_own_vote_and_the_lowest_t_is_taken():
    module = _module()
    filings = [_filing(i) for i in range(30)]
    reports = [_report(i) for i in range(30)]
    # filings alone: half the pool is left at any t above 0.02, and the lowest such t is taken
    t, _curves, _ok = module.lowest_threshold([filings])
    assert t == 0.025
    # with reports as a second group, their ten on-topic pages at 0.2 must go too: t > 0.2
    t, curves, _ok = module.lowest_threshold([filings, reports])
    assert t == 0.205
    kept, _sure, share = curves[1]
    j = module.GRID.index(t)
    assert kept[j] == 1.0 and share[j] <= 0.5
    # half the group's pools crowded with on-topic pages at 0.3, half with their evidence at
    # 0.1: returning at most half the pool drops that evidence, so no t meets both goals
    crowded = [([0.5] + [0.3] * 19, [1] + [0] * 19)] * 15
    faint = [([0.1] + [0.05] * 19, [1] + [0] * 19)] * 15
    assert module.lowest_threshold([filings, crowded + faint])[0] is None
    assert module.lowest_threshold([filings, crowded + faint], max_pool_share=0.55)[0] == 0.055


def test_kept_interval_counts_the_pools_left_empty():
    module = _module()
    reports = [_report(i) for i in range(10)]
    kept, low, high, share, empty = module.kept_interval(reports, 0.4, resamples=200, seed=0)
    assert kept == 0.5 and low == high == 0.5 and share == 0.05 and empty == 0
    assert module.kept_interval(reports, 0.6, resamples=200, seed=0)[4] == 10
