"""skyjax: load-balanced pipeline training of BERT on heterogeneous devices, in JAX."""

from setuptools import find_packages, setup

setup(
    name="skyjax",
    version="0.1.0",
    description="Load-balanced pipeline training of BERT on heterogeneous devices (JAX).",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    # configs/ and experiments/ are installed too, so that config variants import their base
    # (``from configs import bert_base_mnli``) and experiments share code, from any directory.
    packages=find_packages(include=["skyjax", "skyjax.*", "configs", "experiments"]),
    python_requires=">=3.11",
    # The commands (skyjax/cli/), also run as ``python -m skyjax.main``, ``skyjax.launch``, ...
    entry_points={"console_scripts": [
        "skyjax-train=skyjax.cli.train:run",
        "skyjax-launch=skyjax.cli.launch:run",
        "skyjax-profile=skyjax.cli.profile:run",
        "skyjax-compose=skyjax.cli.compose:run",
        "skyjax-plan=skyjax.cli.plan:run",
        "skyjax-export=skyjax.cli.export:run",
        "skyjax-predict=skyjax.cli.predict:run",
        "skyjax-prepare=skyjax.cli.prepare:run",
        "skyjax-handoff-speed=skyjax.cli.handoff_speed:run",
    ]},
    install_requires=[
        # the tested range: jax's APIs move between minor versions (jax.experimental.transfer,
        # jax.distributed's key-value store)
        "jax>=0.10.2,<0.11",
        "jaxlib>=0.10.2,<0.11",
        "flax>=0.12.8",
        "optax>=0.2.4",
        "transformers>=4.40",
        "safetensors>=0.4",
        "absl-py>=2.0",
        "ml_collections>=1.0",
        "numpy>=1.26",
        # plan.png / timeline.png at the end of every run and `python -m skyjax.plan --plot`
        # (skyjax/report/plots.py, imported only when drawing). TensorBoard event files need no
        # package: skyjax/report/tensorboard.py writes them itself (viewing them: pip install tensorboard).
        "matplotlib>=3.8",
    ],
    extras_require={
        # Accelerators: jax's own wheels for NVIDIA GPUs (CUDA 12, pip-installed CUDA libraries;
        # H100/A100 and older cards with a recent driver) and for TPU VMs, in the tested range.
        "gpu": ["jax[cuda12]>=0.10.2,<0.11"],
        "tpu": ["jax[tpu]>=0.10.2,<0.11"],
        # GLUE from TensorFlow Datasets (skyjax/data/glue.py). Reading an array_record
        # preparation needs only tensorflow-datasets; a tfrecord one, and tfds.testing's mock
        # data, need TensorFlow.
        # importlib_resources: tensorflow-datasets' builders need it to prepare a dataset
        # (python -m skyjax.data.prepare) but do not declare it.
        "tfds": ["tensorflow-datasets>=4.9", "tensorflow-cpu>=2.16", "importlib_resources"],
        # Your own data from Hugging Face datasets (config.data.name="hf:...").
        "datasets": ["datasets>=2.14"],
        # torch: the reference implementation the tests compare against. Pinned to the CPU
        # build's version: an unpinned torch pulls several GB of CUDA packages. The GLUE tests
        # (tests/test_glue.py) need the "tfds" extra's packages and the tables tests the
        # "datasets" extra's, repeated here with the same specifiers so that ".[test]" and
        # ".[tfds,datasets,test]" resolve alike; the metric tests compare with scikit-learn;
        # pytest-xdist runs the suite on two workers (.ci/run).
        "test": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.6", "torch==2.13.0",
                 "tensorflow-datasets>=4.9", "tensorflow-cpu>=2.16", "importlib_resources",
                 "datasets>=2.14", "scikit-learn>=1.3"],
    },
)
