"""Which timed calls the reference verifies (server/draws.py verified_calls): the last, one drawn
uniformly, and each other call with a fixed probability, so that the candidate, which sees how
long each segment's answer takes, never learns that the checks are over."""

from __future__ import annotations

import random

import pytest

from kernelagent.harness.server.draws import verified_calls
from kernelagent.harness.server.timed import TIMED_CHECKS


@pytest.mark.parametrize("measured, expected", [
    (0, set()),
    (1, {0}),
    (2, {0, 1}),
    (4, {0, 1, 2, 3}),  # no more others than the checks asked for: every call
])
def test_short_loops_verify_every_call(measured, expected):
    assert verified_calls(random.Random(0), measured, TIMED_CHECKS) == expected


def test_a_long_loop_verifies_the_last_call_and_one_other_always_and_about_three_on_average():
    rng = random.Random(1)
    counts = []
    for _ in range(4000):
        chosen = verified_calls(rng, 512, TIMED_CHECKS)
        assert 511 in chosen and len(chosen) >= 2 and chosen <= set(range(512))
        counts.append(len(chosen) - 1)
    mean = sum(counts) / len(counts)
    assert abs(mean - TIMED_CHECKS) < 0.1, mean
    assert len(set(counts)) > 3  # how many varies
    # short loops too: the uniform draw is not counted twice (a mean of 2.5 at 5 calls before)
    rng = random.Random(2)
    mean = sum(len(verified_calls(rng, 5, TIMED_CHECKS)) - 1 for _ in range(20000)) / 20000
    assert abs(mean - TIMED_CHECKS) < 0.03, mean


def test_one_expected_check_is_refused_it_would_fix_the_count_again():
    with pytest.raises(ValueError):
        verified_calls(random.Random(0), 512, 1)


def test_the_timed_loop_draws_its_verified_calls_with_verified_calls():
    """The call site (server/timed.py): the server runs in a process of its own, so an evaluation
    cannot be steered to a known draw; what the loop calls is read from its source instead."""
    import inspect

    from kernelagent.harness.server.timed import TimedLoop

    source = inspect.getsource(TimedLoop._timed_loop)
    assert "draws.verified_calls(job.rng, measured, TIMED_CHECKS)" in source
    assert "rng.sample(" not in source


def _adaptive_cheat(draw, *, seen_needed: int, draws: int = 2000, calls: int = 2, segments: int = 256):
    """A candidate that counts the segments whose answer came slow (a comparison ran) and, once it
    has seen `seen_needed`, computes wrong in every later segment but the last. (tried, caught)."""
    rng = random.Random(7)
    tried = caught = 0
    for _ in range(draws):
        chosen = draw(rng, calls * segments, TIMED_CHECKS)
        seen, cheating, hit = 0, False, False
        for segment in range(segments - 1):
            here = set(range(segment * calls, (segment + 1) * calls)) & chosen
            hit = hit or (cheating and bool(here))
            seen += bool(here)
            cheating = cheating or seen >= seen_needed
        tried += cheating
        caught += hit
    return tried, caught


def _fixed_three(rng, measured, expected):
    """The draw before: exactly `expected` calls and the last."""
    return set(rng.sample(range(measured - 1), expected)) | {measured - 1}


def test_a_candidate_that_counts_the_slow_answers_is_caught_where_a_fixed_count_let_it_go():
    tried, caught = _adaptive_cheat(_fixed_three, seen_needed=TIMED_CHECKS)
    assert tried > 1500 and caught == 0  # the hole: after three slow answers, no risk at all
    tried, caught = _adaptive_cheat(verified_calls, seen_needed=TIMED_CHECKS)
    assert tried > 500 and caught / tried > 0.4, (tried, caught)
    tried, caught = _adaptive_cheat(verified_calls, seen_needed=1)
    assert caught / tried > 0.8, (tried, caught)


def test_a_loop_wrong_on_every_call_but_the_last_is_always_caught():
    rng = random.Random(3)
    for measured in (5, 12, 64, 512, 4096):
        for _ in range(300):
            assert verified_calls(rng, measured, TIMED_CHECKS) - {measured - 1}
