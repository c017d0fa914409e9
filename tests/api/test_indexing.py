"""api/indexing.py: the uploads' queue serves tenants fairly."""

from __future__ import annotations

import threading

from evidentia.api.indexing import TenantFairQueue


def _get_in_background(queue: TenantFairQueue) -> tuple[threading.Thread, list]:
    got: list = []
    thread = threading.Thread(target=lambda: got.append(queue.get()), daemon=True)
    thread.start()
    return thread, got


def test_a_tenant_never_holds_every_worker_so_another_tenants_upload_finds_one():
    """Two slow uploads of one tenant held both workers, and another tenant's report
    waited 167 s: with two workers a tenant holds one, and the other stays free."""
    queue = TenantFairQueue(workers=2)
    queue.put(("acme", "slow-1", "g1"))
    queue.put(("acme", "slow-2", "g2"))
    assert queue.get() == ("acme", "slow-1", "g1")
    thread, got = _get_in_background(queue)
    thread.join(0.3)
    assert thread.is_alive() and not got  # acme's second upload waits for its first
    queue.put(("beta", "report", "g3"))
    thread.join(2.0)
    assert got == [("beta", "report", "g3")]  # at once, though acme's was older
    thread, got = _get_in_background(queue)
    thread.join(0.3)
    assert not got
    queue.task_done(("acme", "slow-1", "g1"))
    thread.join(2.0)
    assert got == [("acme", "slow-2", "g2")]
    assert queue.qsize() == 0


def test_the_tenant_with_fewest_in_hand_goes_first_then_arrival_order():
    queue = TenantFairQueue(workers=4)  # a tenant holds at most 3
    for item in [("acme", "a1", "g"), ("acme", "a2", "g"), ("acme", "a3", "g"), ("acme", "a4", "g"),
                 ("beta", "b1", "g"), ("gamma", "c1", "g")]:
        queue.put(item)
    order = [queue.get()[1] for _ in range(4)]
    assert order == ["a1", "b1", "c1", "a2"]
    assert queue.qsize() == 2


def test_a_server_of_one_tenant_keeps_every_worker():
    queue = TenantFairQueue(workers=2, shared=lambda: False)
    queue.put(("acme", "a1", "g"))
    queue.put(("acme", "a2", "g"))
    assert [queue.get()[1], queue.get()[1]] == ["a1", "a2"]


def test_one_worker_takes_every_upload_in_turn_and_stop_comes_first():
    queue = TenantFairQueue(workers=1)
    queue.put(("acme", "a1", "g"))
    queue.put(("acme", "a2", "g"))
    first = queue.get()
    queue.task_done(first)
    queue.put(None)
    assert queue.get() is None  # a stop is not kept waiting behind uploads
    queue.task_done(None)
    assert queue.get() == ("acme", "a2", "g")


def test_a_third_tenant_is_served_before_two_backlogs_take_every_freed_worker():
    """Served by the age of their oldest upload, two tenants' backlogs took each worker
    as it freed up, and a third tenant's report waited for one of them to run out (72 s
    for three uploads of 23 s each; an hour for ten of 300 s)."""
    queue = TenantFairQueue(workers=2)
    for n in range(3):
        queue.put(("att1", f"a{n}", "g"))
        queue.put(("att2", f"b{n}", "g"))
    first, second = queue.get(), queue.get()
    assert {first[0], second[0]} == {"att1", "att2"}
    queue.put(("victim", "report", "g"))
    queue.task_done(first)  # a worker frees up: the victim's, though att1's next is older
    assert queue.get() == ("victim", "report", "g")
    queue.task_done(second)
    nxt = queue.get()
    assert nxt[0] == first[0]  # then the backlogs in turn, the one served least recently first
