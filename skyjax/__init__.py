"""skyjax: load-balanced pipeline training of BERT on heterogeneous devices, in JAX.

A re-creation of "Sky Computing" (arXiv 2202.11836). Entry points: ``python -m skyjax.main``
(train and evaluate from a config) and :func:`skyjax.train.train_and_evaluate`.
"""

__version__ = "0.1.0"
