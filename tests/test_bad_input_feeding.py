"""Bad input to the feeding side: `RateLimiter`, `BlockingRateLimiter`, `BufferServer`, `Writer`, and
`sample_mixed` / `mixed_counts`: refused with an error naming the argument; a refused call leaves the limiter's
counts, the server's buffer and the writer's queue exactly as they were."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import jaxbuffers as jb
from bad_inputs import SETTINGS, bad_keys, bad_static_ints, corrupt, snapshot
from bad_inputs import refused as _refused
from jaxbuffers.mixing import mixed_counts, sample_mixed

ITEM = {"obs": jnp.zeros((2,), jnp.float32), "a": jnp.int32(0)}
BAD_RATES = st.sampled_from([0, 0.0, -1.0, float("nan"), float("inf"), "1", None, True, [1.0], 1 + 0j])
BAD_COUNTS = st.sampled_from([-1, 2**31, 1.5, "1", None, True, np.zeros(2, np.int32), jnp.float32(1), [1]])
BAD_TIMEOUTS = st.sampled_from([-1, -0.5, float("nan"), "1", [1]])


def refused(call, name, **kw):
    """`bad_inputs.refused`, with a message that starts with the argument (not JAX's own words that mention it)."""
    err = _refused(call, name, **kw)
    assert str(err).startswith((name,) if isinstance(name, str) else name), f"the message does not start with {name}: {err}"
    return err


def rows(b: int, start: int = 0) -> dict:
    i = np.arange(start, start + b)
    return {"obs": np.stack([i, -i], 1).astype(np.float32), "a": i.astype(np.int32)}


def server_state(server: jb.BufferServer) -> tuple:
    lim = server.rate_limiter
    return snapshot(server.buffer()), (lim.num_inserted, lim.num_sampled) if lim else None


SERVER = jb.BufferServer(jb.ReplayBuffer.create(ITEM, 16), rate_limiter=jb.BlockingRateLimiter(1.0, min_size=1, error_buffer=8.0))
SERVER.add(rows(2))


def test_samples_per_insert_refusals_state_one_range():
    """Zero, negatives, NaN, inf and values above 1e6 all get the one message stating the accepted range."""
    for rate in (0, 0.0, -1.0, float("nan"), float("inf"), 2e6):
        for make in (jb.RateLimiter.create, jb.BlockingRateLimiter):
            with pytest.raises(ValueError, match=r"^samples_per_insert: expected a number in \(0, 1e6\], got "):
                make(rate)


@SETTINGS
@given(rate=BAD_RATES, min_size=st.sampled_from([-1, 1.5, "1", None, True, 2**40]),
       error_buffer=BAD_RATES.filter(lambda v: not (isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0))
       | st.sampled_from([(1.0,), (1.0, 2.0, 3.0), (-1.0, 1.0), "ab"]))
def test_rate_limiter_create_bad_arguments(rate, min_size, error_buffer):
    for make in (jb.RateLimiter.create, jb.BlockingRateLimiter):
        refused(lambda: make(rate), "samples_per_insert")
        refused(lambda: make(1.0, min_size=min_size), "min_size")
        refused(lambda: make(1.0, error_buffer=error_buffer), "error_buffer")


@SETTINGS
@given(n=BAD_COUNTS, batch_size=bad_static_ints())
def test_rate_limiter_bad_counts(n, batch_size):
    lim = jb.RateLimiter.create(1.0, error_buffer=10.0).insert(3)
    for call in (lim.insert, lim.sample, lim.can_insert, lim.can_sample):
        refused(lambda: call(n), "n", state=lim)
    refused(lambda: lim.num_updates(batch_size), "batch_size", state=lim)


@SETTINGS
@given(n=st.sampled_from([-1, 1.5, "1", None, True, [1], np.zeros(2, np.int32)]), timeout=BAD_TIMEOUTS)
def test_blocking_rate_limiter_bad_arguments(n, timeout):
    lim = jb.BlockingRateLimiter(1.0, min_size=1, error_buffer=4.0)
    lim.await_insert(2)
    counts = lambda: (lim.num_inserted, lim.num_sampled)  # noqa: E731
    for call in (lim.await_insert, lim.await_sample):
        refused(lambda: call(n), "n", state=counts)
        refused(lambda: call(1, timeout), "timeout", state=counts)
    refused(lambda: lim.await_insert(1000), "n", state=counts)  # no balance ever admits it


def test_a_wait_takes_its_timeout_as_every_wait_does():
    """A wait's `timeout` as `PendingSave.wait`'s: None or a Python or numpy number >= 0; a bool (once read as 1 s)
    or a str is the wrong kind (TypeError), a negative or NaN value a ValueError."""
    lim = jb.BlockingRateLimiter(1.0, min_size=1, error_buffer=4.0)
    lim.await_insert(1, timeout=np.float32(0.5))
    counts = lambda: (lim.num_inserted, lim.num_sampled)  # noqa: E731
    for bad in (True, "1", [1]):
        refused(lambda: lim.await_insert(1, bad), "timeout", state=counts, exc=(TypeError,))
    for bad in (-1, float("nan")):
        refused(lambda: lim.await_sample(1, bad), "timeout", state=counts, exc=(ValueError,))
    server = jb.BufferServer(jb.ReplayBuffer.create(ITEM, 4))  # no limiter: nothing waits, the timeout is still checked
    for bad in (True, "1", -1):
        refused(lambda: server.add(rows(1), timeout=bad), "timeout", state=lambda: server_state(server))
        refused(lambda: server.sample(None, 1, timeout=bad), "timeout", state=lambda: server_state(server))


@SETTINGS
@given(bad=corrupt(rows(3), "batch"), timeout=BAD_TIMEOUTS)
@example(bad=({**rows(3), "obs": np.full((3, 2), 1e300)}, "batch['obs']"), timeout=-1)  # was stored as inf float32
@example(bad=({**rows(3), "a": np.full(3, 2**40 + 5, np.int64)}, "batch['a']"), timeout=-1)  # was stored as 5
def test_server_add_refused_before_the_limiter_counts(bad, timeout):
    """A batch the buffer refuses is refused before the rate limiter counts its inserts: counts and buffer as
    they were. A float64 / int64 numpy leaf (which the jitted add would narrow) is refused as the plain add refuses it."""
    err = refused(lambda: SERVER.add(bad[0]), (bad[1], "batch"), state=lambda: server_state(SERVER))
    wide = [x for x in jax.tree.leaves(bad[0]) if isinstance(x, np.ndarray) and x.dtype in (np.float64, np.int64)]
    if wide:
        assert f"got {wide[0].dtype}" in str(err) and "nothing is cast" in str(err), err
    refused(lambda: SERVER.add(rows(1), timeout=timeout), "timeout", state=lambda: server_state(SERVER))


@SETTINGS
@given(key=bad_keys().filter(lambda k: k is not None), batch_size=bad_static_ints())
def test_server_sample_refused_before_the_limiter_counts(key, batch_size):
    refused(lambda: SERVER.sample(key, 1), "key", state=lambda: server_state(SERVER))
    refused(lambda: SERVER.sample(None, batch_size), "batch_size", state=lambda: server_state(SERVER))


@SETTINGS
@given(buffer=st.sampled_from([None, 1, "buf", {"a": 1}]), fn=st.sampled_from([1, "add"]), seed=st.sampled_from([-1, 1.5, "0", None]))
def test_server_and_writer_constructors(buffer, fn, seed):
    buf = jb.ReplayBuffer.create(ITEM, 4)
    refused(lambda: jb.BufferServer(buffer), "buffer")
    refused(lambda: jb.BufferServer(buf, add=fn), "add")
    refused(lambda: jb.BufferServer(buf, sample=fn), "sample")
    refused(lambda: jb.BufferServer(buf, rate_limiter=jb.RateLimiter.create(1.0)), "rate_limiter")
    refused(lambda: jb.BufferServer(buf, seed=seed), "seed")
    refused(lambda: jb.Writer(buffer, 2), "server")
    refused(lambda: jb.Writer(SERVER, seed), "flush_size")


def test_writer_flush_size_is_a_size():
    """`flush_size` is checked as every size is: a Python or numpy int in [1, 2**31 - 1], kept as a Python int."""
    assert type(jb.Writer(SERVER, np.int32(2)).flush_size) is int
    for bad in (0, 2.0, True, 2**31):
        refused(lambda: jb.Writer(SERVER, bad), "flush_size", exc=(ValueError,))


@SETTINGS
@given(first=st.booleans(), bad=corrupt({k: v[0] for k, v in rows(1).items()}, "item"))
@example(first=True, bad=({**{k: v[0] for k, v in rows(1).items()}, "obs": jax.ShapeDtypeStruct((2,), jnp.float32)}, "item['obs']"))
def test_writer_refuses_an_item_before_queueing_it(first, bad):
    """A wrong item is refused by `append` (the first against the buffer, later ones against the first): the
    queue and the server stay as they were, and the next flush adds the right items only."""
    server = jb.BufferServer(jb.ReplayBuffer.create(ITEM, 16))
    writer = jb.Writer(server, 3)
    if not first:
        writer.append({k: v[0] for k, v in rows(1, 5).items()})
    state = lambda: (writer.num_pending, server_state(server))  # noqa: E731
    refused(lambda: writer.append(bad[0]), (bad[1], bad[1].replace("item", "batch"), "item", "batch"), state=state)
    writer.flush()
    assert int(server.buffer().size()) == (0 if first else 1)


# ---------------------------------------------------------------------------------------------------------------
# sample_mixed / mixed_counts


def _source(value: float):
    return lambda key, n: {"x": jnp.full((n, 2), value, jnp.float32)}


@SETTINGS
@given(key=bad_keys(), batch_size=bad_static_ints(),
       props=st.sampled_from([None, 1.0, "ab", iter([1, 1]), np.array([[1.0, 1.0]]), np.array([True, True]), [], [1.0], [1.0, -1.0], [0.0, 0.0], [1.0, float("nan")],
                              [1.0, float("inf")], [1.0, "1"], [True, 1.0], [1.0, None]]),
       samplers=st.sampled_from([None, _source(0.0), [1, _source(0.0)], [_source(0.0), lambda k, n: [1]],
                                 [_source(0.0), lambda k, n: {"x": jnp.zeros((n, 2), jnp.int32)}],
                                 [_source(0.0), lambda k, n: {"x": jnp.zeros((n + 1, 2), jnp.float32)}]]),
       shuffle=st.sampled_from([1, "no", None, np.array(True)]))
def test_sample_mixed_bad_arguments(key, batch_size, props, samplers, shuffle):
    good = [_source(0.0), _source(1.0)]
    k = jax.random.key(0)
    refused(lambda: sample_mixed(key, good, 4, [1.0, 1.0]), "key")
    refused(lambda: sample_mixed(k, good, batch_size, [1.0, 1.0]), "batch_size")
    refused(lambda: mixed_counts(batch_size, [1.0, 1.0]), "batch_size")
    refused(lambda: sample_mixed(k, good, 4, props), "proportions")
    if not isinstance(props, list) or len(props) == 2:
        refused(lambda: mixed_counts(4, props), "proportions")
    refused(lambda: sample_mixed(k, samplers, 4, [1.0, 1.0]), ("samplers", "proportions"))
    refused(lambda: sample_mixed(k, good, 4, [1.0, 1.0], shuffle=shuffle), "shuffle")


@SETTINGS
@given(form=st.sampled_from(["list", "tuple", "ints", "numpy_floats", "numpy_array"]), batch_size=st.integers(1, 9))
def test_mixed_counts_accepted_forms(form, batch_size):
    """The table: proportions a list or tuple of Python or numpy numbers (ints too), or a 1-d numpy array of numbers,
    normalised by their sum."""
    props = {"list": [1.0, 3.0], "tuple": (1.0, 3.0), "ints": [1, 3], "numpy_floats": [np.float32(1), np.float64(3)],
             "numpy_array": np.array([1.0, 3.0])}[form]
    assert mixed_counts(batch_size, props) == mixed_counts(batch_size, [0.25, 0.75])
    assert sum(mixed_counts(batch_size, props)) == batch_size


def test_server_with_a_custom_add_refuses_a_leaf_jax_would_narrow():
    """A custom `add` that would take a float64 leaf still gets it refused, named by its path, never cast."""
    srv = jb.BufferServer(jb.ReplayBuffer.create({"x": np.zeros(2, np.float32)}, capacity=10), add=lambda b, batch: b)
    _refused(lambda: srv.add({"x": np.full((3, 2), 1e300)}), "batch['x']")


def test_ray_server_checks_every_argument_before_ray():
    """`ray_server` refuses what `BufferServer` / `BlockingRateLimiter` would refuse inside the actor, at the call and
    before Ray is imported or started (before, it returned a handle to an actor that died on its first call)."""
    import sys

    buf = jb.ReplayBuffer.create(ITEM, 4)
    refused(lambda: jb.ray_server(buf, rate_limit=dict(samples_per_inserts=4.0)), "rate_limit", exc=(TypeError,))
    refused(lambda: jb.ray_server(buf, rate_limit=dict(min_size=3)), "rate_limit", exc=(TypeError,))
    refused(lambda: jb.ray_server(buf, rate_limit=[4.0]), "rate_limit", exc=(TypeError,))
    refused(lambda: jb.ray_server(buf, rate_limit=dict(samples_per_insert=-1.0)), "samples_per_insert", exc=(ValueError,))
    refused(lambda: jb.ray_server(None), "buffer", exc=(TypeError,))
    refused(lambda: jb.ray_server(buf, max_concurrency=0), "max_concurrency", exc=(ValueError,))
    refused(lambda: jb.ray_server(buf, seed=-1), "seed", exc=(ValueError,))
    refused(lambda: jb.ray_server(buf, add=3), "add", exc=(TypeError,))
    refused(lambda: jb.ray_server(buf, sed=1), "ray_server", exc=(TypeError,))
    refused(lambda: jb.ray_server(buf, rate_limiter=jb.BlockingRateLimiter(1.0)), "rate_limiter", exc=(TypeError,))
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


def test_messages_name_what_the_caller_passed():
    """The writer names the item's leaf and the dtypes (not an "example", not x64), the server's sample names its
    `batch_size` (not the limiter's `n`), and a limiter's own call keeps `n`, with the right article."""
    server = jb.BufferServer(jb.ReplayBuffer.create(ITEM, 16), rate_limiter=jb.BlockingRateLimiter(2.0, min_size=1, error_buffer=8.0))
    writer = jb.Writer(server, 3)
    item = {k: v[0] for k, v in rows(1).items()}
    err = refused(lambda: writer.append({**item, "obs": item["obs"].astype(np.float64)}), "item['obs']", exc=(TypeError,))
    assert str(err).startswith("item['obs']: expected dtype float32, got float64") and "example" not in str(err), err
    err = refused(lambda: writer.append({**item, "a": 1}), "item['a']", exc=(TypeError,))
    assert str(err).startswith("item['a']: expected a numeric or bool array (JAX or numpy), got int 1"), err
    server.add(rows(4))
    err = refused(lambda: server.sample(None, 100, timeout=0.1), "batch_size", exc=(ValueError,))
    assert str(err).startswith("batch_size: a sample of 100 items moves the balance"), err
    err = refused(lambda: server.rate_limiter.await_insert(100), "n", exc=(ValueError,))
    assert str(err).startswith("n: an insert of 100 items"), err


def test_writer_names_the_shape_of_the_item_passed():
    """An item with a stray batch axis is refused naming its own shape `(1, 2)`, first in a batch or not (the first
    item's message gave the shape of the batch it was checked in, `(4, 1, 2)`)."""
    server = jb.BufferServer(jb.ReplayBuffer.create({"x": jnp.int32(0), "o": jnp.zeros(2)}, 16))
    writer = jb.Writer(server, 4)
    stray = {"x": np.zeros(1, np.int32), "o": np.zeros((1, 2), np.float32)}
    for pending in (0, 1):
        with pytest.raises(ValueError, match=r"^item\['(o|x)'\]: .*got (an item of shape )?\((1, 2|1,)\)") as e:
            writer.append(stray)
        assert "(4, 1" not in str(e.value) and "(4, 1, 2)" not in str(e.value), str(e.value)
        assert writer.num_pending == pending
        writer.append({"x": np.int32(0), "o": np.zeros(2, np.float32)})
