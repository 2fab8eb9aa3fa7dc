"""A trained decoder language model (GPT-2, Llama) taken home: the run's checkpoint as a Hugging
Face directory that ``AutoModelForCausalLM.from_pretrained`` loads (:func:`export_run`), and a
greedy continuation of a prompt (:func:`generate`), from that directory or a run's workdir.

The checkpoint holds each parameter once by path (``params/<path>``); a tied embedding's head
copy is not saved (``checkpoint.names.tied_names``) and is read from the embedding. The
directory: ``config.json`` (the pretrained ``config.json``'s keys, when the run started from one,
under the trained shape's, ``DecoderConfig.to_hf``; ``architectures`` ``LlamaForCausalLM`` or
``GPT2LMHeadModel``, ``torch_dtype`` float32), ``model.safetensors`` (float32, HF's names, a
tied embedding once, as ``save_pretrained`` stores it), the run's tokenizer, and
``skyjax.json`` (``format`` 1, ``model_type``, ``seq_len``, ``dataset``, ``step``,
``checkpoint``). Written as ``DIR.partial-<pid>`` and renamed, as BERT's export
(:mod:`.hf_format`).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import numpy as np

from skyjax import data as data_lib
from skyjax.checkpoint.names import key_path, saved_name, tied_names
from skyjax.export import trained
from skyjax.export.hf_format import check_out

MAX_NEW_TOKENS = 32  # python -m skyjax.predict --generate's default


def is_lm_run(workdir: str) -> bool:
    """Whether the run in ``workdir`` trained a decoder language model."""
    return data_lib.is_causal_lm(trained.run_config(workdir))


def _abstract(config: Any) -> tuple[Any, Any]:
    """``(DecoderConfig, the model with shapes for parameters)`` of a run's config, float32."""
    from flax import nnx

    from skyjax.models import build, decoder_units

    cfg = build.model_config(config.model)
    return cfg, nnx.eval_shape(lambda: decoder_units.DecoderForCausalLM(cfg, nnx.Rngs(0)))


def consolidate(workdir: str, step: int | None = None) -> tuple[Any, dict, Any, Any]:
    """``(run config, DecoderConfig, params tree of model_params, the checkpoint)``: every
    parameter read by name from the run's checkpoint (latest that verifies, or ``step``)."""
    import jax

    from skyjax.models import decoder_units
    from skyjax.models.units import model_params

    config = trained.run_config(workdir)
    resume = trained.find_checkpoint(workdir, step)
    cfg, abstract = _abstract(config)
    tied = tied_names(decoder_units.units(abstract, "layer"))
    index = trained._index(resume)
    flat, treedef = jax.tree_util.tree_flatten_with_path(model_params(abstract))
    leaves = []
    for path, like in flat:
        name = saved_name(f"{trained.PARAMS}{key_path(path)}", tied)
        if name not in index:
            raise trained.ExportError(f"checkpoint {resume.path}: tensor {name} is missing "
                                      "(another model shape than the workdir's config.json?)")
        x = index.read(name)
        if tuple(x.shape) != tuple(like.shape):
            raise trained.ExportError(f"checkpoint {resume.path}: tensor {name} has shape "
                                      f"{tuple(x.shape)}, the model {tuple(like.shape)}")
        leaves.append(np.asarray(x, np.float32))
    return config, cfg, jax.tree.unflatten(treedef, leaves), resume


def _hf_config(config: Any, cfg: Any) -> dict:
    from skyjax.models import hf_config

    base = {}
    if config.model.pretrained and os.path.isdir(config.model.pretrained):
        base = hf_config.read(config.model.pretrained, model_types=hf_config.MODEL_TYPES)
    return {**base, **cfg.to_hf(), "torch_dtype": "float32"}


def export_run(workdir: str, out: str, step: int | None = None) -> list[str]:
    """The run's checkpoint written as the Hugging Face directory ``out`` (module doc); returns
    what was written, one line each."""
    from safetensors.numpy import save_file

    from skyjax.data import lm_text, text
    from skyjax.models import decoder_hf

    check_out(out)
    config, cfg, params, resume = consolidate(workdir, step)
    tensors = decoder_hf.to_hf_state_dict(params, cfg, tied_copy=False)
    tmp = f"{out.rstrip(os.sep)}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        hf = _hf_config(config, cfg)
        found = text.tokenizer_dir(config)
        if found is not None:  # its special tokens are the model's
            tokenizer = lm_text.load_tokenizer(found[1], found[0])
            tokenizer.save_pretrained(tmp)
            hf.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(hf, f, indent=2)
        meta = {"format": 1, "model_type": cfg.family, "seq_len": int(config.data.seq_len),
                "dataset": config.data.name, "step": resume.step, "checkpoint": resume.path}
        with open(os.path.join(tmp, "skyjax.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2)
        if os.path.isdir(out):
            os.rmdir(out)  # empty (check_out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    count = int(sum(x.size for x in tensors.values()))
    return [f"step {resume.step} of {workdir} -> {out}: {len(tensors)} tensors, {count:,} "
            f"parameters, a {cfg.family} language model",
            f"tokenizer from {found[1]}" if found else "no tokenizer"]


def load(workdir: str | None = None, model_dir: str | None = None, step: int | None = None
         ) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of an exported directory or a run's workdir, float32."""
    from skyjax.data import lm_text, text
    from skyjax.models import decoder_hf

    if model_dir is not None:
        return (decoder_hf.from_pretrained(model_dir),
                lm_text.load_tokenizer(model_dir, "--model"))
    import jax
    import jax.numpy as jnp
    from flax import nnx

    config, cfg, params, _ = consolidate(workdir, step)
    _, abstract = _abstract(config)
    graphdef, state = nnx.split(abstract)
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
    found = text.tokenizer_dir(config)
    if found is None:
        raise trained.ExportError(f"{workdir}: the run names no tokenizer "
                                  "(config.data.tokenizer or config.model.pretrained)")
    return nnx.merge(graphdef, state), lm_text.load_tokenizer(found[1], found[0])


def generate(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int = MAX_NEW_TOKENS
             ) -> str:
    """The greedy continuation of ``prompt`` (the arg-max token each time, up to
    ``max_new_tokens`` or the end-of-text token or the model's positions): the text after the
    prompt. Each token runs the whole sequence again (no cache; a short demo's length)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    if not ids:
        ids = [int(tokenizer.eos_token_id)]  # an empty prompt starts from the separator
    limit = model.config.max_position_embeddings
    ids = ids[-limit:]
    graphdef, state = nnx.split(model)
    # one compiled shape: the sequence padded to the model's positions (a causal model's
    # logits at a position do not see what follows it)
    logits = jax.jit(lambda st, x: nnx.merge(graphdef, st)(x))
    start = len(ids)
    while len(ids) - start < max_new_tokens and len(ids) < limit:
        padded = np.full((1, limit), tokenizer.eos_token_id, np.int32)
        padded[0, :len(ids)] = ids
        nxt = int(jnp.argmax(logits(state, padded)[0, len(ids) - 1]))
        if nxt == tokenizer.eos_token_id:
            break
        ids.append(nxt)
    return tokenizer.decode(ids[start:])
