"""A trained model taken home: a run's checkpoint, saved under any plan, process count or number
of pipelines, as one Hugging Face directory (``python -m skyjax.export``), and predictions on new
rows or GLUE's test sets (``python -m skyjax.predict``), on one device.

* ``trained``: the run's config, checkpoint and parameters gathered into one model;
* ``hf_format``: the Hugging Face directory (names, ``config.json``, tokenizer, ``skyjax.json``)
  and a run exported as one;
* ``inference``: rows of a file tokenised as in training, the model's predictions, the TSV;
* ``glue_submission``: GLUE's test splits as the files the GLUE server takes;
* ``predict``: a model loaded from a run or a directory, its predictions written;
* ``lm``: a decoder language model's export (``AutoModelForCausalLM``) and greedy continuation.
"""
