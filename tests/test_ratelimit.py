"""Rate limiters: the band held over 10k inserts (in jit and with threads), blocking, timeouts, shutdown, errors."""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuffers as jb


def test_jitted_loop_holds_the_ratio_within_its_band():
    """10k inserts in batches of 8, an update of 32 whenever allowed: sampled items stay in the band."""
    rho, m, err, b, batch = 2.5, 200, 64.0, 8, 32
    lim = jb.RateLimiter.create(rho, min_size=m, error_buffer=err)

    def step(lim, _):
        lim = lim.insert(b)
        n = lim.num_updates(batch)
        lim = lim.sample(n * batch)
        return lim, (lim.num_samples_allowed(), n)

    lim, (left, updates) = jax.jit(lambda l: jax.lax.scan(step, l, None, length=10_000 // b))(lim)
    inserted, sampled = lim.num_inserted(), lim.num_sampled()
    assert inserted == 10_000 and sampled == int(np.sum(updates)) * batch
    # After every step the balance rho * I - S lies in [rho * m - err, rho * m + err + rho * b].
    cum_i = b * np.arange(1, 10_000 // b + 1)
    cum_s = batch * np.cumsum(np.asarray(updates))
    d = rho * cum_i - cum_s
    started = cum_i >= m
    assert np.all(d[started] >= rho * m - err) and np.all(d[started] <= rho * m + err + batch)
    assert np.all(cum_s[~started] == 0)
    assert abs(sampled / (inserted - m) - rho) < (err + batch) / (inserted - m)
    assert np.all(np.asarray(left) < batch)  # every allowed update ran


def test_rule_matches_reverb_semantics():
    lim = jb.RateLimiter.create(2.0, min_size=3, error_buffer=(1.0, 4.0))  # band [6 - 1, 6 + 4]
    assert bool(lim.can_insert(3)) and not bool(lim.can_sample(1))
    lim = lim.insert(3)  # balance 6
    assert int(lim.num_samples_allowed()) == 1 and int(lim.num_inserts_allowed()) == 2
    assert bool(lim.can_insert(2)) and not bool(lim.can_insert(3))
    lim = lim.sample(1)  # balance 5
    assert not bool(lim.can_sample(1)) and int(lim.num_inserts_allowed()) == 2
    lim = lim.insert(2)  # balance 9
    assert int(lim.num_samples_allowed()) == 4 and int(lim.num_updates(3)) == 1


def test_fractional_ratio_is_exact_and_counters_do_not_overflow():
    lim = jb.RateLimiter.create(1 / 3, min_size=0, error_buffer=2.0)
    assert (lim.band.num, lim.band.den) == (1, 3)
    big = 2**29
    lim = jax.jit(lambda l: jax.lax.fori_loop(0, 8, lambda i, l: l.insert(big).sample(big // 3), l))(lim)
    assert lim.num_inserted() == 8 * big and lim.num_sampled() == 8 * (big // 3)
    assert lim.num_inserted() > 2**31  # past int32, exact


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(samples_per_insert=0.0), "samples_per_insert"),
        (dict(samples_per_insert=float(np.pi)), "fraction"),
        (dict(samples_per_insert=4.0, error_buffer=2.0), "narrower"),
        (dict(samples_per_insert=1.0, min_size=-1), "min_size"),
        (dict(samples_per_insert=1.0, error_buffer=(1.0,)), "pair"),
    ],
)
def test_invalid_configuration_names_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        jb.RateLimiter.create(**kwargs)
    with pytest.raises(ValueError, match=match):
        jb.BlockingRateLimiter(**kwargs)


def test_traced_count_must_be_integer():
    lim = jb.RateLimiter.create(1.0)
    with pytest.raises(TypeError, match="n: expected an int"):
        lim.insert(jnp.float32(1))
    with pytest.raises(ValueError, match="n: expected an int in"):
        lim.sample(-1)


def test_threads_hold_the_band_over_10k_inserts():
    """4 inserting threads and a sampling thread: at every admission the balance stays within the band."""
    rho, m, err = 1.0, 100, 40.0
    lim = jb.BlockingRateLimiter(rho, min_size=m, error_buffer=err)
    seen, lock = [], threading.Lock()

    def record():
        with lock:
            seen.append((lim.num_inserted, lim.num_sampled))

    def actor():
        for _ in range(2_500 // 5):
            lim.await_insert(5, timeout=20)
            record()

    def learner():
        while lim.num_sampled < 10_000 - m - err:
            lim.await_sample(16, timeout=20)
            record()

    threads = [threading.Thread(target=actor) for _ in range(4)] + [threading.Thread(target=learner)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads) and time.monotonic() - t0 < 30
    assert lim.num_inserted == 10_000
    d = np.array([rho * i - s for i, s in seen if i >= m])
    assert d.min() >= rho * m - err - 1e-9 and d.max() <= rho * m + err + 1e-9


def test_blocked_caller_times_out_with_a_clear_error():
    lim = jb.BlockingRateLimiter(1.0, min_size=10, error_buffer=5.0)
    t0 = time.monotonic()
    with pytest.raises(jb.RateLimiterTimeout, match=r"sample of 1 items: not admitted within timeout=0.2 s \(inserted=0"):
        lim.await_sample(1, timeout=0.2)
    assert 0.2 <= time.monotonic() - t0 < 2
    assert lim.num_samples_allowed() == 0 and lim.num_inserts_allowed() == 15
    lim.await_insert(15, timeout=0)  # filling (10) then 5 more: balance 15 = offset + 5
    assert lim.num_samples_allowed() == 10 and lim.num_inserts_allowed() == 0
    with pytest.raises(jb.RateLimiterTimeout, match="insert of 1 items"):
        lim.await_insert(1, timeout=0.05)


def test_close_wakes_blocked_callers_and_refuses_later_ones():
    lim = jb.BlockingRateLimiter(1.0, min_size=10, error_buffer=5.0)
    errors = []

    def wait():
        try:
            lim.await_sample(1, timeout=30)
        except jb.RateLimiterClosed as e:
            errors.append(e)

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    lim.close()
    for t in threads:
        t.join(5)
    assert time.monotonic() - t0 < 5 and len(errors) == 3
    assert "closed" in str(errors[0])
    with pytest.raises(jb.RateLimiterClosed):
        lim.await_insert(1)


def test_request_no_balance_can_admit_is_refused():
    lim = jb.BlockingRateLimiter(1.0, min_size=0, error_buffer=4.0)
    with pytest.raises(ValueError, match="split the request"):
        lim.await_sample(9, timeout=0)
    with pytest.raises(ValueError, match=r"batch: an insert of 9 items moves the balance by 9.0, more than the 8.0"):
        lim.check_insert(9, name="batch")  # refused without waiting or counting
    lim.check_insert(8)
    assert lim.num_inserted == 0 and lim.num_inserts_allowed() == 4
    with pytest.raises(ValueError, match="n: "):
        lim.check_insert(-1)


@pytest.mark.parametrize("rho, m, err", [(0.25, 7, (3.0, 1.5)), (3.0, 0, 5.0), (1.0, 20, 2.0)])
def test_jitted_and_blocking_limiters_agree_step_by_step(rho, m, err):
    """Random requests: both limiters admit exactly the same ones and report the same allowances."""
    rng = np.random.default_rng(int(rho * 100) + m)
    state = jb.RateLimiter.create(rho, min_size=m, error_buffer=err)
    host = jb.BlockingRateLimiter(rho, min_size=m, error_buffer=err)

    @jax.jit
    def step(state, is_insert, n):
        ok = jnp.where(is_insert, state.can_insert(n), state.can_sample(n))
        n_ok = jnp.where(ok, n, 0)
        new = jax.lax.cond(is_insert, lambda s: s.insert(n_ok), lambda s: s.sample(n_ok), state)
        return new, ok, new.num_inserts_allowed(), new.num_samples_allowed()

    for _ in range(300):
        is_insert, n = bool(rng.random() < 0.5), int(rng.integers(0, 4))
        state, ok, ins, smp = step(state, is_insert, jnp.int32(n))
        wait = host.await_insert if is_insert else host.await_sample
        try:
            wait(n, timeout=0)
            host_ok = True
        except jb.RateLimiterTimeout:
            host_ok = False
        except ValueError:  # a request no balance admits: the state refuses it too
            host_ok = False
        assert bool(ok) == host_ok
        assert (int(ins), int(smp)) == (host.num_inserts_allowed(), host.num_samples_allowed())
    assert (state.num_inserted(), state.num_sampled()) == (host.num_inserted, host.num_sampled)


def test_blocking_reserved_insert_admits_no_sample_until_committed_and_cancel_gives_the_room_back():
    lim = jb.BlockingRateLimiter(1.0, min_size=2, error_buffer=(2.0, 2.0))
    lim.reserve_insert(2, timeout=0)
    assert lim.num_inserted == 0 and lim.num_samples_allowed() == 0 and lim.num_inserts_allowed() == 2
    with pytest.raises(jb.RateLimiterTimeout):
        lim.await_sample(1, timeout=0.01)  # the reserved items were not stored yet
    lim.reserve_insert(2, timeout=0)  # the band's room above: 2 more
    with pytest.raises(jb.RateLimiterTimeout):
        lim.reserve_insert(1, timeout=0.01)
    lim.cancel_insert(2)  # that insert did not run: its room is free again, nothing counted
    assert lim.num_inserted == 0 and lim.num_inserts_allowed() == 2
    lim.commit_insert(2)
    assert lim.num_inserted == 2 and lim.num_samples_allowed() == 2
    lim.await_sample(2, timeout=0)
    with pytest.raises(ValueError, match=r"^n: commit_insert of 1 items, but only 0 are reserved"):
        lim.commit_insert(1)
