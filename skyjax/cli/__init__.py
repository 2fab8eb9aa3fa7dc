"""The commands, one module each: each parses its arguments and calls the library function that
does the work, so that everything a command does can also be called from Python, and no library
module parses a command line. Each runs as ``python -m`` under its own name (the dotted name
users type, a two-line module naming the one here) and as a console script:

* ``train``: ``python -m skyjax.main`` (``skyjax-train``), train and evaluate a config;
* ``launch``: ``python -m skyjax.launch`` (``skyjax-launch``), N local processes of a module;
* ``profile``: ``python -m skyjax.profile`` (``skyjax-profile``), a config's profile measured;
* ``compose``: ``python -m skyjax.profile.compose`` (``skyjax-compose``), a cluster's profile
  from its parts;
* ``plan``: ``python -m skyjax.plan`` (``skyjax-plan``), a plan from a profile file;
* ``export``: ``python -m skyjax.export`` (``skyjax-export``), a run's model as a Hugging Face
  directory;
* ``predict``: ``python -m skyjax.predict`` (``skyjax-predict``), a model's predictions on rows;
* ``prepare``: ``python -m skyjax.data.prepare`` (``skyjax-prepare``), a GLUE task for TFDS;
* ``handoff_speed``: ``python -m skyjax.transport.handoff_speed`` (``skyjax-handoff-speed``),
  hand-off GB/s between two processes;
* ``flags``: the argument parsing they share, failures in one line.
"""
