"""A pipeline process keeps no host copy of its units once they are on their devices: the arrays
an executor is built from (made by ``skyjax.models.build`` as ``skyjax.train`` makes them, or
restored from a checkpoint) are freed, and nothing the executor reaches holds a parameter-shaped
array besides its stages' own state."""

from __future__ import annotations

import gc
import types
import weakref

import jax
import numpy as np

from skyjax.optim import make_optimizer
from tests.helpers import executor, make_batch, tiny_config

BLOCKS = [(0, 2), (2, 4)]  # embeddings + layer 0 | layer 1 + head


def _built_units():
    """The units of the tiny model with parameters, made as a process makes its own."""
    from skyjax.models import build

    c = tiny_config(2, layers=2)
    c.model.num_labels = 3  # tests.helpers.make_batch's
    init = build.UnitInitializer(c.model, c.train.seed)
    chain = build.materialize(init, build.abstract_chain(c.model, c.train.seed, "layer"),
                              range(4))
    init.release()
    return chain, make_optimizer(c.train, clip=False)


def _reachable_arrays(root) -> list:
    """Every numpy or JAX array reachable from ``root`` through object references. Modules,
    classes and functions' globals are not followed (they are the whole process's); functions'
    closures and defaults are."""
    seen, stack, found = set(), [root], []
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType)):
            continue
        seen.add(id(obj))
        if isinstance(obj, (np.ndarray, jax.Array)):
            found.append(obj)
        elif isinstance(obj, types.FunctionType):
            stack.extend(_contents(c) for c in obj.__closure__ or ())
            stack.extend((obj.__defaults__, obj.__kwdefaults__))
        else:
            stack.extend(gc.get_referents(obj))
    return found


def _contents(cell: types.CellType):
    try:
        return cell.cell_contents
    except ValueError:  # a cell not assigned yet
        return None


def test_the_units_an_executor_is_built_from_are_freed():
    chain, optimizer = _built_units()
    given = [weakref.ref(x) for u in chain for x in jax.tree.leaves(u.params)]
    ex = executor(chain, BLOCKS, "1f1b", 2, optimizer)
    del chain
    gc.collect()
    assert [r for r in given if r() is not None] == []
    assert np.isfinite(ex.train_step(0, make_batch(0)).loss)  # and it trains
    ex.close()


def test_restored_unit_states_are_freed_once_placed():
    chain, optimizer = _built_units()
    host = {u: jax.device_get((unit.params, optimizer.init(unit.params)))
            for u, unit in enumerate(chain)}  # as skyjax.checkpoint.restore_units returns them
    given = [weakref.ref(x) for x in jax.tree.leaves(host)]
    assert all(isinstance(r(), np.ndarray) for r in given)
    ex = executor(chain, BLOCKS, "gpipe", 2, optimizer, unit_states=host)
    del host, chain
    gc.collect()
    # On CPU, placing an aligned numpy array may adopt its buffer (zero-copy): such an array
    # lives on as the device array itself, never beside it.
    placed = {x.unsafe_buffer_pointer() for s in ex.stages
              for x in jax.tree.leaves((s.state.params, s.state.opt_state))}
    assert [r for r in given if r() is not None and r().ctypes.data not in placed] == []
    ex.train_step(0, make_batch(0))  # the update replaces every array of the state
    gc.collect()
    assert [r for r in given if r() is not None] == []
    ex.close()


def test_an_executor_reaches_no_parameter_arrays_but_its_state():
    chain, optimizer = _built_units()
    shapes = {x.shape for u in chain for x in jax.tree.leaves(u.params) if x.ndim}
    ex = executor(chain, BLOCKS, "1f1b", 2, optimizer)
    del chain
    ex.train_step(0, make_batch(0))
    gc.collect()
    state = {id(x) for s in ex.stages
             for x in jax.tree.leaves((s.state.params, s.state.opt_state, s.state.grads))}
    stray = [(type(x).__name__, x.shape) for x in _reachable_arrays(ex)
             if x.shape in shapes and id(x) not in state]
    assert stray == []
    ex.close()
