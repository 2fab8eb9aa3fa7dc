"""The exchange behind the backward as data (``skyjax.plan.pricing.buckets``) and the backward
cut by buckets (``skyjax.programs.buckets``); the runtime's bit-for-bit test is in
tests/test_data_parallel.py."""

import pytest

from skyjax.plan.pricing.buckets import bucket_ready_s, pieces, stage_buckets


def test_stage_buckets_run_from_the_last_units_down_cut_at_the_stage():
    assert stage_buckets(2, 5) == [(4, 5), (3, 4), (2, 3)]
    assert stage_buckets(3, 10, size=4) == [(8, 10), (4, 8), (3, 4)]


def test_a_message_travels_in_pieces_its_own_gradients_first_by_bucket():
    assert pieces((2, 3, 4), early=(2, 3, 4)) == [(4,), (3,), (2,)]
    assert pieces((2, 3, 4), early=(3,)) == [(3,), (2, 4)]
    assert pieces((2, 3, 4)) == [(2, 3, 4)]
    assert pieces((4, 5, 6, 7), early=(4, 5, 6, 7), size=2) == [(6, 7), (4, 5)]


def test_bucket_ready_times_add_the_units_backward_from_the_last_down():
    got = bucket_ready_s(1, 4, [9.0, 1.0, 2.0, 4.0, 8.0])
    assert got == [((3, 4), 4.0), ((2, 3), 6.0), ((1, 2), 7.0)]


@pytest.mark.slow
def test_the_backward_by_buckets_covers_every_unit_and_its_single_bucket_is_the_backward():
    """Every unit's gradient comes from exactly one bucket; one bucket of all units gives the
    whole backward's bits (several buckets: XLA compiles each program on its own, and its
    rounding may differ from the whole backward's by an ulp, so the runtime takes the bucketed
    programs whether or not the exchange overlaps)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from skyjax.models.bert import initial_carry
    from skyjax.programs.stage import StageProgram
    from tests.helpers import fresh_chain, make_batch, rng_for

    chain = fresh_chain()[1:3]
    batch = {k: v[:4] for k, v in make_batch(0).items()}
    carry = initial_carry(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    carry = fresh_chain()[0].apply(fresh_chain()[0].params, carry, rng_for(0, 0, 4), True)
    prog = StageProgram(chain, is_last=False, microbatches=1)
    params = [u.params for u in chain]
    zeros = jax.tree.map(jnp.zeros_like, params)
    out, res = prog.forward(params, carry, rng_for(0, 0, 4))
    cot = {k: jnp.ones_like(v) for k, v in out.items() if jnp.issubdtype(v.dtype, jnp.floating)}
    whole, d_whole = prog.backward(params, res, cot, jax.tree.map(jnp.copy, zeros))
    for bounds in [((0, 2),), ((1, 2), (0, 1))]:
        grads, carried, d_carry = [None, None], [], None
        for j, (lo, hi) in enumerate(bounds):
            grads[lo:hi], carried, out = prog.backward_bucket(
                bounds, j, params, res, cot, carried, jax.tree.map(jnp.copy, zeros[lo:hi]))
            d_carry = out if out is not None else d_carry
        assert d_carry is not None and all(g is not None for g in grads)
        close = np.testing.assert_array_equal if len(bounds) == 1 else (
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6))
        jax.tree.map(lambda a, b: close(np.asarray(a), np.asarray(b)), (whole, d_whole),
                     (grads, d_carry))
