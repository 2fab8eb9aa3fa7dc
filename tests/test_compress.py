"""Sparse, low-bit outer steps (``skyjax.compress``, ``skyjax.runtime.compressed``) and the sparse
hand-off codec (``skyjax.codecs`` ``sparse``): exact bytes on the wire, the quantizer's error
bound at the kept positions, error feedback that loses nothing over steps, replicas that stay
one model, and the price the planner, the simulator and the rehearsal charge for them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from skyjax import codecs, compress, topk_wire

ENCODE = jax.jit(compress.topk_lowbit_encode, static_argnums=(1, 2))


def tree(seed=0):
    k = jax.random.split(jax.random.key(seed), 2)
    return {"w": jax.random.normal(k[0], (300, 40)), "b": jax.random.normal(k[1], (7,))}


def zeros(t):
    return jax.tree.map(jnp.zeros_like, t)


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("fraction", [1 / 64, 0.03, 1.0])
def test_payload_bytes_are_exact_and_kept_values_within_the_quantizers_bound(bits, fraction):
    x = tree()
    payload, decoded, _ = ENCODE(x, fraction, bits, zeros(x))
    sent = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(payload))
    assert sent == compress.tree_payload_bytes(x, fraction, bits)
    chunks, c, k = topk_wire.chunking(12007, fraction, bits)
    assert sent == chunks * (2 * k + -(-k * bits // 8) + 4)
    assert payload["idx"].dtype == jnp.uint16 and payload["idx"].shape == (chunks, k)
    # the receiver decodes the same tree as the sender
    again = compress.topk_lowbit_decode(payload, x, fraction, bits)
    jax.tree.map(np.testing.assert_array_equal, again, decoded)
    flat = np.concatenate([np.asarray(x["b"]), np.asarray(x["w"]).ravel()])  # leaves' order
    dec = np.concatenate([np.asarray(decoded["b"]), np.asarray(decoded["w"]).ravel()])
    flat = np.pad(flat, (0, chunks * c - flat.size)).reshape(chunks, c)
    dec = np.pad(dec, (0, chunks * c - dec.size)).reshape(chunks, c)
    for row, got in zip(flat, dec):
        kept = np.argsort(-np.abs(row), kind="stable")[:k]
        scale = np.abs(row[kept]).max() / (2 ** bits - 1)
        # the top k by magnitude are the ones kept, each within half a step (one scale)
        assert np.count_nonzero(got) <= k and set(np.flatnonzero(got)) <= set(kept)
        assert np.abs(got[kept] - row[kept]).max() <= scale * (1 + 1e-5)
    if fraction == 1.0 and bits == 4:  # everything kept: only the rounding remains
        assert np.count_nonzero(dec) > 0.9 * dec.size


def test_at_one_sixty_fourth_in_two_bits_the_wire_is_over_100x_smaller():
    n = 110_000  # a unit's gradients (the demo's are of this order)
    assert 4 * n / topk_wire.payload_bytes(n, 1 / 64, 2) > 100
    assert topk_wire.payload_bytes(4096, 1 / 64, 2) == 148
    assert topk_wire.payload_bytes(4096, 1 / 64, 4) == 164


def test_error_feedback_conserves_the_sum_over_steps():
    """What is not sent is carried: sum of the decoded trees + the last residual = the sum of
    the inputs, and the residual stays bounded (it does not grow with the steps)."""
    r = zeros(tree())
    sent, given, norms = zeros(r), zeros(r), []
    for step in range(40):
        x = tree(step)
        _, decoded, r = ENCODE(x, 1 / 64, 2, r)
        sent = jax.tree.map(jnp.add, sent, decoded)
        given = jax.tree.map(jnp.add, given, x)
        norms.append(float(jnp.sqrt(sum(jnp.sum(a * a) for a in jax.tree.leaves(r)))))
    back = jax.tree.map(jnp.add, sent, r)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-4, rtol=1e-5),
                 back, given)
    assert max(norms[20:]) < 3 * max(norms[:20])  # carried, not accumulating without bound
    assert any(np.asarray(a).any() for a in jax.tree.leaves(sent))


def test_a_non_finite_value_stays_visible():
    x = tree()
    x["w"] = x["w"].at[3, 5].set(jnp.nan)
    _, decoded, _ = ENCODE(x, 1 / 64, 2, zeros(x))
    assert not np.isfinite(np.asarray(decoded["w"])).all()


def test_the_sparse_hand_off_codec_keeps_the_top_half_of_each_rotated_block():
    """After its fixed sign flips and rotation (which decoding undoes, so rotating the decoded
    block gives what was sent): the 32 values of largest magnitude of each block within half a
    step of their level (8 from the least of them to the largest), the rest at their sign and
    the dropped half's mean magnitude; the scales' own rounding (bfloat16, 255ths) adds at most
    1 % of the largest."""
    x = jax.random.normal(jax.random.key(0), (8, 32, 128)).at[..., 3].multiply(30.0)
    coded = codecs.encode_array("sparse", x)
    back = codecs.decode_array("sparse", coded, x)
    rotate = jax.jit(lambda v: codecs._flip_rotate(codecs._blocks(v)))
    sent, got = np.asarray(rotate(x)).reshape(-1, 64), np.asarray(rotate(back)).reshape(-1, 64)
    for row, b in zip(sent, got):
        a = np.abs(row)
        order = np.argsort(-a)
        top, rest = order[:32], order[32:]
        hi, lo = a[top].max(), a[top].min()
        slack = 0.01 * hi + 1e-5
        assert np.abs(b[top] - row[top]).max() <= (hi - lo) / 7 / 2 + slack
        assert (np.sign(b[rest]) == np.sign(row[rest])).all()
        np.testing.assert_allclose(np.abs(b[rest]), a[rest].mean(), atol=slack)


def test_the_bound_allows_the_sparse_codec_only_from_two_bits():
    from skyjax.relax import Relaxation

    assert "sparse" not in Relaxation(handoff_bits=4).handoff_codecs
    assert Relaxation(handoff_bits=2).handoff_codecs[-1] == "sparse"
    r = Relaxation(averaging="diloco", outer_compression="topk2")
    assert r.compressed and r.measured_codecs[-1] == "topk2"
    assert not Relaxation(outer_compression="topk2").compressed  # nothing averaged relaxed
    with pytest.raises(ValueError, match="outer_compression"):
        Relaxation(outer_compression="topk3")
    with pytest.raises(ValueError, match="outer_topk"):
        Relaxation(outer_topk=0.0)


COMPRESSED = {"outer_compression": "topk2", "outer_topk": 1 / 16}
TWO = [[(0, (0, 3)), (1, (3, 5))], [(2, (0, 5))]]


def run(averaging, steps=6, **outer):
    """Losses and every pipeline's params after each step of two pipelines (``TWO``)."""
    import optax

    from skyjax import plan as plan_lib
    from skyjax.runtime.local_executor import LocalExecutor
    from tests.helpers import BATCH, SEQ, fresh_chain, make_batch, rng_for

    stages = [plan_lib.Stage(d, block, 0.0, 0.0, 0, pipeline=i)
              for i, stages in enumerate(TWO) for d, block in stages]
    plan = plan_lib.Plan("manual", "1f1b", 4, stages, 0.0, 0.0, False, shares=[2, 2],
                         averaging=averaging, **outer)
    ex = LocalExecutor(fresh_chain(), plan, jax.devices(), batch_size=BATCH, seq_len=SEQ,
                       optimizer=optax.adamw(1e-3), max_grad_norm=0.5, rng=rng_for)
    losses, replicas = [], []
    for step in range(steps):
        losses.append(ex.train_step(step, make_batch(step)).loss)
        replicas.append([jax.tree.map(np.asarray, ex.replica_params(i)) for i in range(2)])
    ex.close()
    return np.array(losses), replicas


def identical(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.slow
@pytest.mark.parametrize("mode,outer", [("int8", {}), ("diloco", {"outer_every": 3,
                                                                  "outer_lr": 0.7,
                                                                  "outer_momentum": 0.5})])
def test_compressed_averaging_keeps_one_model_and_learns_like_its_mode(mode, outer):
    """Every owner sums the same decoded replicas: after each exchange (int8: every step;
    DiLoCo: its outer steps) the replicas are bit-identical; the losses stay near the
    uncompressed mode's, and differ from them (the wire is top-k)."""
    plain, _ = run(mode, **outer)
    losses, replicas = run(mode, **outer, **COMPRESSED)
    synced = range(6) if mode == "int8" else (2, 5)
    for step in synced:
        assert identical(replicas[step][0], replicas[step][1]), step
    if mode == "diloco":
        assert not identical(replicas[1][0], replicas[1][1])  # between outer steps
    assert np.isfinite(losses).all()
    assert np.abs(losses - plain).max() < 0.05 * np.abs(plain).max()
    assert not np.array_equal(losses, plain)


def test_a_compressed_modes_state_is_named_and_charged():
    """The compressed averagings' state: DiLoCo's anchor and momentum plus the residual, each
    pipeline's own (three copies charged); the int8 modes keep one residual (top-k's)."""
    from skyjax.plan.data_parallel.pipelines import state_copies
    from skyjax.relax import Relaxation
    from skyjax.runtime import compressed

    relax = Relaxation(averaging="diloco", outer_compression="topk2")
    for mode in ("int8-across", "int8", "diloco-across", "diloco"):
        cls = compressed.state_class(compressed.mode_name(mode, "topk2"))
        assert cls is compressed.CLASSES[mode]
        assert len(cls.STATE) == state_copies(mode, 2, relax), mode
        assert "residual" in cls.STATE and "residual" not in cls.SHARED
    assert compressed.state_class(compressed.mode_name("diloco", "none")).STATE == (
        "anchor", "momentum")


def _two_regions(rate=4e-10):
    """Two regions of two devices behind 100 Mbit/s and 40 ms, four one-device pipelines;
    int8 and top-k 2-bit coding timed."""
    from skyjax.profile.format import Profile
    from tests.helpers import make_profile

    same = np.arange(4)[:, None] // 2 == np.arange(4)[None, :] // 2
    js = make_profile(np.full((6, 4), 0.002), state=np.full(6, 4e6),
                      latency=np.where(same, 1e-4, 0.04),
                      bandwidth=np.where(same, 4e9, 12.5e6)).to_json()
    for j, dev in enumerate(js["devices"]):
        dev["region"] = f"r{j // 2}"
    for unit in js["units"]:
        unit["param_bytes"] = 1e6
    js["codecs"] = {name: {"output_bytes": [1.0] * 6, "seconds_per_byte": [rate] * 4}
                    for name in ("int8", "topk2")}
    return Profile.from_json(js)


def test_the_planner_and_the_simulator_price_the_compressed_bytes_per_phase():
    """Per mode, the price of ``outer_compression`` is the routing's per-phase formula with the
    top-k bytes (the model's exact ratio) and coding rate in the coded phases; the plan records
    the compression (plan.json round trip), the rehearsal declares the compressed bytes on the
    coded pairs, and the simulator's outer exchange is latency + bytes / bandwidth + coding."""
    import dataclasses
    import json

    from skyjax import plan as plan_lib
    from skyjax.plan.data_parallel.pipelines import grad_prefix, relaxed_exchange
    from skyjax.plan.pricing import topk
    from skyjax.plan.pricing.exchange import BACK, BETWEEN, IN_GROUP, PHASES, routing
    from skyjax.plan.replay.exchange_run import exchange_of, run_exchange
    from skyjax.plan.replay.rehearsal import rehearsal_times
    from skyjax.relax import Relaxation

    base = _two_regions()
    prof = dataclasses.replace(base, relax=Relaxation(
        averaging="diloco", outer_every=4, min_gain=0.0, outer_compression="topk2",
        outer_topk=1 / 64))
    chains = [[(d, 0, 6)] for d in range(4)]
    gp = grad_prefix(prof)
    ratio = topk.wire_ratio(gp, 1 / 64, 2)
    assert ratio == pytest.approx(6 * topk_wire.payload_bytes(250_000, 1 / 64, 2) / 6e6)
    assert 1 / ratio > 100
    lat, bw, rate = prof.latency_s, prof.bandwidth_Bps, np.full(4, 4e-10)

    def coded(route, phases, on):
        total = 0.0
        for ph in phases:
            send = {}
            for m in route.messages:
                if m.phase == ph:
                    g = sum(gp[x + 1] - gp[x] for x in m.units)
                    c = lat[m.src, m.dst] + g * (ratio if ph in on else 1.0) / bw[m.src, m.dst]
                    send[m.src] = send.get(m.src, 0.0) + c + (rate[m.src] * g if ph in on else 0)
            total += max(send.values(), default=0.0)
        return total

    direct, grouped = routing(chains, None), routing(chains, [[0, 1], [2, 3]], np.diff(gp))
    price = {m: relaxed_exchange(chains, gp, prof, (m,))[0]
             for m in ("int8-across", "int8", "diloco-across", "diloco")}
    assert price["int8"] == pytest.approx(coded(direct, PHASES, PHASES), rel=1e-12)
    assert price["int8-across"] == pytest.approx(coded(grouped, PHASES, (BETWEEN,)), rel=1e-12)
    assert price["diloco"] == pytest.approx(coded(direct, PHASES, PHASES) / 4, rel=1e-12)
    assert price["diloco-across"] == pytest.approx(
        coded(grouped, (IN_GROUP, BACK), ())
        + coded(grouped, (BETWEEN, BACK), (BETWEEN,)) / 4, rel=1e-12)
    plain = dataclasses.replace(base, relax=Relaxation(averaging="diloco", outer_every=4,
                                                       min_gain=0.0))
    assert price["diloco"] < relaxed_exchange(chains, gp, plain, ("diloco",))[0] / 5

    plan = plan_lib.evaluate_pipelines(prof, chains, [1, 1, 1, 1])
    assert plan.outer_compression == "topk2" and plan.outer_topk == 1 / 64
    back = plan_lib.Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert back.to_json() == plan.to_json()
    dec = rehearsal_times(plan, prof)
    r = routing(chains, plan.exchange_groups, given=plan.exchange_reps)
    for m in r.messages:
        g = sum(gp[x + 1] - gp[x] for x in m.units)
        on = plan.averaging in ("int8", "diloco") or m.phase == BETWEEN
        assert dec.wire_bytes[m.src, m.dst] == pytest.approx(g * (ratio if on else 1.0))
        assert (dec.coding_s[m.src, m.dst] > 0) == on

    two = plan_lib.evaluate_pipelines(prof, [[(0, 0, 6)], [(2, 0, 6)]], [1, 1],
                                      averaging="diloco")
    assert two.averaging == "diloco" and two.outer_compression == "topk2"
    run = exchange_of(two)
    assert run.coded == PHASES and run.compression == "topk2"
    at, _ = run_exchange(run, run.outer_step, {0: 0.0, 2: 0.0}, prof)
    assert at[0] == pytest.approx(0.04 + 6e6 * ratio / 12.5e6 + 4e-10 * 6e6, rel=1e-9)
