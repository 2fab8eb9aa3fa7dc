"""Tied weights across stages (skyjax.runtime.tied): a GPT-2's token embedding, which its LM head
also uses, held by the first and the last stage; every step each copy's gradient becomes the sum
of both uses', exchanged between the two stages. The losses equal the one-device training of
the tied model (one tensor, jax.grad through both uses) within 1e-5 for several cuts, schedules
and pipeline counts, and the two copies stay bit for bit equal, under a relaxed plan too."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from skyjax import plan as plan_lib
from skyjax.models import decoder_units
from skyjax.models.decoder import DecoderConfig
from skyjax.runtime import tied
from skyjax.runtime.local_executor import LocalExecutor
from tests.helpers import rng_for

BATCH, SEQ, VOCAB, STEPS, CLIP, LR = 8, 16, 64, 4, 0.5, 3e-3
CFG = DecoderConfig(family="gpt2", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, max_position_embeddings=SEQ, hidden_act="gelu_new",
                    norm_eps=1e-5, tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                    hidden_dropout_prob=0.1, embedding_dropout_prob=0.1,
                    attention_probs_dropout_prob=0.1)


def lm_batch(step):
    """A language model's batch: tokens, next-token labels (-100 at a few positions), a row
    padded at its end."""
    rng = np.random.default_rng(step)
    tokens = rng.integers(0, VOCAB, (BATCH, SEQ + 1)).astype(np.int32)
    mask = np.ones((BATCH, SEQ), np.int32)
    mask[3, 12:] = 0
    labels = np.where(mask > 0, tokens[:, 1:], -100).astype(np.int32)
    labels[:, 0] = -100
    return {"input_ids": tokens[:, :-1], "attention_mask": mask, "labels": labels}


def chain(granularity="layer"):
    return decoder_units.units(decoder_units.DecoderForCausalLM(CFG, nnx.Rngs(0)), granularity)


def reference_losses(units, m):
    """One device, one embedding tensor: the head's copy is the embedding (its gradient is
    both uses'), AdamW after global-norm clipping."""
    from skyjax.metrics import classification_loss
    from skyjax.models import bert

    (i, ipath), (j, jpath) = decoder_units.tied_pairs(units)[0]

    def tie(params):
        return [tied._set(p, jpath, tied._get(params[i], ipath)) if k == j else p
                for k, p in enumerate(params)]

    def loss_fn(params, batch, step):
        params, size, total = tie(params), BATCH // 4, 0.0
        for mb in range(4):
            sl = {k: v[mb * size:(mb + 1) * size] for k, v in batch.items()}
            carry = {"input_ids": sl["input_ids"], "attention_mask": sl["attention_mask"]}
            out = bert.apply_units(units, params, carry, rng_for(step, mb * size, size), True)
            total += classification_loss(out["logits"], sl["labels"])[0] / 4
        return total

    optimizer = optax.chain(optax.clip_by_global_norm(CLIP), optax.adamw(LR))

    @jax.jit
    def train_step(params, state, batch, step):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, step)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    params = jax.tree.map(np.array, [u.params for u in units])
    state, losses = optimizer.init(params), []
    for step in range(STEPS):
        params, state, loss = train_step(params, state, lm_batch(step), step)
        losses.append(float(loss))
    return losses


def run(units, pipelines, shares, schedule, codec="none", averaging="exact"):
    """The losses of a hand-made plan (``codec`` on every hand-off, ``averaging`` between its
    pipelines); the two copies of the tied embedding are asserted bit for bit equal."""
    stages = [plan_lib.Stage(d, block, 0.0, 0.0, 0, pipeline=i,
                             codec=codec if k < len(stages) - 1 else "none")
              for i, stages in enumerate(pipelines) for k, (d, block) in enumerate(stages)]
    plan = plan_lib.Plan("manual", schedule, sum(shares), stages, step_time_s=0.0,
                         bottleneck_s=0.0, exact=False,
                         shares=list(shares) if len(shares) > 1 else None, averaging=averaging)
    ex = LocalExecutor(units, plan, jax.devices(), batch_size=BATCH, seq_len=SEQ,
                       optimizer=optax.adamw(LR), max_grad_norm=CLIP, rng=rng_for)
    try:
        losses = [ex.train_step(step, lm_batch(step)).loss for step in range(STEPS)]
        copies = [(s, slot) for s in ex.stages for slot in s.tied]
        for s, slot in copies:  # both copies bit for bit equal
            mine = np.asarray(tied._get(s.state.params[slot.local], slot.path))
            if slot.peer is None:
                other = tied._get(s.state.params[slot.other_local], slot.other_path)
            else:
                peer = next(t for t in ex.stages if t.pipeline == s.pipeline
                            and t.index == slot.peer)
                other = next(tied._get(peer.state.params[o.local], o.path) for o in peer.tied)
            np.testing.assert_array_equal(mine, np.asarray(other))
        return losses
    finally:
        ex.close()


@pytest.fixture(scope="module")
def reference():
    return reference_losses(chain(), 4)


def test_the_chain_names_its_tied_pair_and_stages_find_it():
    units = chain()
    assert decoder_units.tied_pairs(units) == [((0, ("wte", "embedding")),
                                                (3, ("lm_head", "embedding")))]
    assert tied.second_copies(units) == {3: [("lm_head", "embedding")]}
    first, last = tied.stage_slots(units, 0, 2, 0, 2), tied.stage_slots(units, 2, 4, 1, 2)
    assert first == (tied.TiedSlot(0, ("wte", "embedding"), True, 1),)
    assert last == (tied.TiedSlot(1, ("lm_head", "embedding"), False, 0),)
    assert tied.stage_slots(units, 1, 3, 1, 3) == ()
    both = tied.stage_slots(units, 0, 4, 0, 1)
    assert both == (tied.TiedSlot(0, ("wte", "embedding"), True, None, 3,
                                  ("lm_head", "embedding")),)


@pytest.mark.parametrize("pipelines,shares,schedule", [
    ([[(0, (0, 4))]], [4], "1f1b"),  # one stage: summed without a message
    ([[(0, (0, 1)), (1, (1, 4))]], [4], "1f1b"),
    ([[(0, (0, 3)), (1, (3, 4))]], [4], "gpipe"),
    ([[(0, (0, 2)), (1, (2, 3)), (2, (3, 4))]], [4], "1f1b"),
    ([[(0, (0, 2)), (1, (2, 4))], [(2, (0, 1)), (3, (1, 4))]], [2, 2], "1f1b"),  # 2 pipelines
    ([[(0, (0, 3)), (1, (3, 4))], [(2, (0, 4))]], [3, 1], "gpipe"),
])
def test_losses_equal_the_tied_model_on_one_device(reference, pipelines, shares, schedule):
    losses = run(chain(), pipelines, shares, schedule)
    np.testing.assert_allclose(losses, reference, atol=1e-5, rtol=0)


def test_relaxed_hand_offs_and_averaging_keep_the_copies_equal(reference):
    """int8 hand-offs and int8 averaging between two pipelines (a relaxed plan): the math is
    relaxed, not the tie: each pipeline's two copies stay bit for bit equal, and the losses stay
    near the exact ones."""
    losses = run(chain(), [[(0, (0, 2)), (1, (2, 4))], [(2, (0, 3)), (3, (3, 4))]], [2, 2],
                 "1f1b", codec="int8", averaging="int8")
    np.testing.assert_allclose(losses, reference, atol=5e-2, rtol=0)
