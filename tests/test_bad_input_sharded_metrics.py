"""Bad input to `ShardedBuffer.record`: what is not a sample of this sharded buffer (one unsharded buffer's sample,
a per-device sample of another number of shards, a global sample whose shards, indices or generations do not fit) is
refused with an error naming the field, eagerly and under `jit`, the sharded state unchanged."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jaxbuffers as jb
from bad_inputs import refused

S = min(jax.device_count(), 2)
MESH = jax.make_mesh((S,), ("data",), devices=jax.devices()[:S])
ITEM = {"x": jnp.zeros((2,), jnp.float32)}
BUF = jb.ShardedBuffer.create(lambda: jb.PrioritisedReplayBuffer.create(ITEM, capacity=4), MESH, "data").add(
    {"x": jnp.zeros((2 * S, 2), jnp.float32)})
GLOBAL = BUF.sample(jax.random.key(0), 3)
LOCAL = BUF.sample_local(jax.random.key(1), 3)


def _refused_eagerly_and_jitted(bad, name: str) -> None:
    refused(lambda: BUF.record(bad), name, state=BUF.shards)
    refused(lambda: jax.jit(jb.ShardedBuffer.record)(BUF, bad), name, state=BUF.shards)


def test_record_refuses_what_is_not_a_sample_of_this_sharded_buffer():
    refused(lambda: BUF.record(jnp.arange(3)), "sample", state=BUF.shards)
    refused(lambda: BUF.record(GLOBAL._replace(sample=jnp.arange(3))), "sample.sample", state=BUF.shards)
    one = jb.PrioritisedReplayBuffer.create(ITEM, capacity=4).add({"x": jnp.zeros((2, 2))}).sample(jax.random.key(0), 3)
    err = refused(lambda: BUF.record(one), "sample.indices", state=BUF.shards)  # one unsharded buffer's sample
    assert "ShardedSample" in str(err)
    _refused_eagerly_and_jitted(GLOBAL.sample, "sample.indices")  # the inner sample of a global one
    _refused_eagerly_and_jitted(LOCAL._replace(indices=jnp.zeros((S + 1, 3), jnp.int32)), "sample.indices")  # S + 1 shards


def test_a_rollout_has_no_metrics_to_record_or_read():
    step = {"obs": jnp.zeros((2,), jnp.float32), "action": jnp.int32(0), "reward": jnp.float32(0)}
    roll = jb.ShardedBuffer.create(lambda: jb.RolloutBuffer.create(step, num_envs=1, num_steps=2), MESH, "data")
    refused(lambda: roll.record(LOCAL), "record", state=roll.shards, exc=(TypeError,))
    refused(lambda: roll.stats(), "stats", state=roll.shards, exc=(TypeError,))


def test_record_refuses_fields_of_the_wrong_kind_or_shape():
    _refused_eagerly_and_jitted(GLOBAL._replace(shard=GLOBAL.shard[:2]), "sample.shard")
    _refused_eagerly_and_jitted(GLOBAL._replace(shard=GLOBAL.shard.astype(jnp.float32)), "sample.shard")
    _refused_eagerly_and_jitted(GLOBAL._replace(sample=GLOBAL.sample._replace(indices=GLOBAL.sample.indices * 1.0)),
                                "sample.sample.indices")
    _refused_eagerly_and_jitted(GLOBAL._replace(sample=GLOBAL.sample._replace(generations=GLOBAL.sample.generations[:1])),
                                "sample.sample.generations")
    _refused_eagerly_and_jitted(LOCAL._replace(generations=LOCAL.generations[:, :2]), "sample.generations")
    _refused_eagerly_and_jitted(LOCAL._replace(generations=LOCAL.generations * 1.0), "sample.generations")
    err = refused(lambda: BUF.record(GLOBAL._replace(shard=np.full(3, S, np.int32))), "sample.shard", state=BUF.shards)
    assert f"[0, {S})" in str(err)  # a concrete shard this buffer does not have (another sharded buffer's sample)


def test_the_accepted_forms_count_every_draw():
    buf = BUF.record(GLOBAL).record(LOCAL)
    buf = buf.record(GLOBAL._replace(shard=np.asarray(GLOBAL.shard, np.int64), sample=GLOBAL.sample._replace(
        indices=np.asarray(GLOBAL.sample.indices, np.int64))))  # numpy int64 fields: saturated to int32, as unsharded
    s = buf.stats()
    assert (s["samples"], s["stale"], s["record_calls"]) == (3 + 3 * S + 3, 0, 3)
