"""The pipeline runtime: a :class:`~skyjax.plan.Plan` in, training steps out. Import the
submodules (this package imports nothing, so ``distributed`` can start before any backend):

* ``stage``: one stage's jitted forward / backward / update / evaluate (``StageProgram``);
* ``pipeline``: the per-stage loop over schedule actions (``PipelineStage``), step results;
* ``placement``: a plan's stages, the shapes crossing each cut, ``build_stage``;
* ``batches``: micro-batch slicing and shapes;
* ``local_executor``: every stage here, one thread each (``LocalExecutor``);
* ``distributed_executor``: this process's stage under ``jax.distributed``
  (``DistributedExecutor``);
* ``recovery``: several pipelines going on without a lost process's pipeline (``Recovery``);
* ``transport``: moving arrays between stages (``LocalTransport``, ``TransferServerTransport``);
* ``tags``: every message tag range, in one table;
* ``distributed``: ``jax.distributed`` start-up, key-value store, shutdown.
"""
