"""The pipeline runtime: a :class:`~skyjax.plan.Plan` in, training steps out. Import the
submodules (this package imports nothing, so a process can start ``jax.distributed`` before any
backend):

* ``pipeline``: the per-stage loop over schedule actions (``PipelineStage``);
* ``role``: what the plan makes a stage, fixed when it is made (``StageRole``);
* ``replicas``: after a step's actions, the gradient sum with other pipelines, the norm;
* ``tied``: a tensor two stages hold (a decoder's tied embedding), its gradients summed;
* ``steps``: a step's records: a stage's inputs (``StepInputs``), its results (``StepResult``);
* ``placement``: a plan's stages and their roles, the shapes crossing each cut, ``build_stage``;
* ``batches``: micro-batch slicing and shapes;
* ``local_executor``: every stage in this process, one thread each (``LocalExecutor``);
* ``distributed_executor``: this process's stage under ``jax.distributed``
  (``DistributedExecutor``);
* ``executors``: this process's transport and executor for a run's config;
* ``exchange``: the exact gradient exchange between pipelines, through link groups (``Routes``);
* ``averaging``: relaxed averaging across pipelines (int8 with error feedback, DiLoCo);
* ``compressed``: the relaxed averagings with their exchange in top-k and 2 or 4 bits;
* ``decentralized``: averaging with one peer per step, or applied k steps late; average now;
* ``recovery``: several pipelines going on without a lost process's pipeline (``Recovery``);
* ``replanner``: the ``dynamic`` strategy during training (observe, decide, rebuild);
* ``rehearsal``: another cluster rehearsed on this host from its profile (``Rehearsal``,
  ``config.rehearse``);
* ``memory``: host memory per process (``summary.json``'s ``memory``).
"""
