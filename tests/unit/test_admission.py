"""Admission: one permit per input, counted against a fixed capacity; past it, a refusal that takes nothing."""

from __future__ import annotations

from server.core.admission import Admission


def test_a_fresh_admission_has_no_permits_in_use() -> None:
    """Nothing is in flight before the first request."""
    assert Admission(10).used == 0


def test_try_acquire_takes_one_permit_per_input() -> None:
    """A request of 3 inputs takes 3 permits, and says so."""
    admission = Admission(10)
    assert admission.try_acquire(3) == 3
    assert admission.used == 3


def test_permits_add_up_across_requests() -> None:
    """Each request's permits count on top of the others' in flight."""
    admission = Admission(10)
    admission.try_acquire(3)
    admission.try_acquire(4)
    assert admission.used == 7


def test_a_request_that_exactly_fills_the_capacity_is_admitted() -> None:
    """The last free permit can be taken: capacity is inclusive."""
    admission = Admission(10)
    admission.try_acquire(7)
    assert admission.try_acquire(3) == 3
    assert admission.used == 10


def test_release_gives_permits_back() -> None:
    """Released permits are free again: the whole capacity can be taken once all are back."""
    admission = Admission(10)
    admission.try_acquire(6)
    admission.release(6)
    assert admission.used == 0
    assert admission.try_acquire(10) == 10


def test_a_request_past_the_capacity_is_refused_with_none() -> None:
    """When the inputs do not fit in the permits left, the answer is None (the server's 429)."""
    admission = Admission(10)
    admission.try_acquire(8)
    assert admission.try_acquire(3) is None


def test_a_refused_request_takes_no_permits() -> None:
    """A refusal leaves the count as it was, so the permits that are left still serve a smaller request."""
    admission = Admission(10)
    admission.try_acquire(8)
    admission.try_acquire(3)
    assert admission.used == 8
    assert admission.try_acquire(2) == 2


def test_a_request_larger_than_the_capacity_takes_all_of_it() -> None:
    """An idle server admits a request of more inputs than permits, taking every permit."""
    admission = Admission(10)
    assert admission.try_acquire(50) == 10
    assert admission.used == 10


def test_a_request_larger_than_the_capacity_is_refused_while_others_hold_permits() -> None:
    """Needing the whole capacity, an oversized request waits until nothing else is in flight."""
    admission = Admission(10)
    admission.try_acquire(1)
    assert admission.try_acquire(50) is None
    assert admission.used == 1


def test_a_request_takes_at_least_one_permit() -> None:
    """Even a request that counts no inputs holds a permit while it is in flight."""
    admission = Admission(10)
    assert admission.try_acquire(0) == 1
    assert admission.used == 1


def test_held_permits_count_towards_the_inputs() -> None:
    """A request already holding 3 permits takes only the 2 more it needs for 5 inputs."""
    admission = Admission(10)
    admission.try_acquire(3)
    assert admission.try_acquire(5, held=3) == 2
    assert admission.used == 5


def test_held_permits_that_cover_the_inputs_take_nothing_more() -> None:
    """When what is held already covers the inputs, nothing is taken and the answer is 0, not None."""
    admission = Admission(10)
    admission.try_acquire(4)
    assert admission.try_acquire(3, held=4) == 0
    assert admission.used == 4


def test_held_permits_let_an_oversized_request_take_the_rest_of_the_capacity() -> None:
    """A request larger than the capacity, already holding some permits, takes just the rest."""
    admission = Admission(10)
    admission.try_acquire(4)
    assert admission.try_acquire(50, held=4) == 6
    assert admission.used == 10


def test_only_the_permits_beyond_those_held_must_fit() -> None:
    """With 9 of 10 in use, 2 of them this request's, growing to 3 inputs fits (1 more); to 5 it does not."""
    admission = Admission(10)
    admission.try_acquire(2)
    admission.try_acquire(7)
    assert admission.try_acquire(3, held=2) == 1
    assert admission.try_acquire(5, held=3) is None
    assert admission.used == 10


def test_bulk_work_cannot_take_the_reserved_share() -> None:
    """With a quarter reserved, bulk requests (priority above 0) stop at three quarters of the
    permits, and interactive ones still get the rest."""
    admission = Admission(100, reserve=0.25)
    assert admission.try_acquire(75, bulk=True) == 75
    assert admission.try_acquire(1, bulk=True) is None
    assert admission.try_acquire(25) == 25


def test_a_bulk_request_larger_than_its_share_takes_all_of_the_share() -> None:
    """As a request larger than the capacity runs alone, a bulk one larger than the bulk share
    takes all of that share, never the reserve."""
    admission = Admission(100, reserve=0.25)
    assert admission.try_acquire(500, bulk=True) == 75
    assert admission.try_acquire(10) == 10


def test_bulk_fits_only_within_the_bulk_share() -> None:
    """bulk_fits says whether the permits in use leave room for bulk work (a request found bulk
    after its first permit asks it), while covering held permits again never refuses."""
    admission = Admission(100, reserve=0.25)
    assert admission.try_acquire(75) == 75
    assert admission.bulk_fits()
    assert admission.try_acquire(1) == 1
    assert not admission.bulk_fits()
    assert admission.try_acquire(1, held=1, bulk=True) == 0  # already covered: not a new claim
