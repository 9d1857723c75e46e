"""CODA for Slurm: CPU-aware scheduling of GPU jobs (job_submit/coda + coda-node)."""

import os
from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="coda-slurm",
    version="0.1.0",
    description="Make Slurm CPU-aware for GPU training jobs (after CODA, ICDCS 2020)",
    license="GPL-2.0-or-later",
    classifiers=[
        "License :: OSI Approved :: GNU General Public License v2 or later (GPLv2+)",
    ],
    long_description=(Path(__file__).parent / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(
        include=[
            "coda_common",
            "coda_common.*",
            "slurm_plugin",
            "slurm_plugin.*",
            "coda_node",
            "coda_node.*",
        ]
    ),
    # The public traces `coda-slurm simulate philly|muri` replay, each with its licence
    # (slurm_plugin/sim/data/README.md).
    package_data={"slurm_plugin.sim": ["data/README.md", "data/*/*"]},
    # The floors are Debian 12's versions, which the Debian packages (debian/) run on.
    setup_requires=["cffi>=1.15.1"],
    # csrc/build_perf.py: coda_node._perf, the perf_event_open(2) syscall wrappers.
    # csrc/build_plugin.py: the embedded-Python Slurm plugin (job_submit_coda.so), unless
    # CODA_BUILD_PLUGIN=0: debian/rules builds it on its own, into coda-slurm-plugin.
    cffi_modules=["csrc/build_perf.py:ffibuilder"]
    + (["csrc/build_plugin.py:ffibuilder"] if os.environ.get("CODA_BUILD_PLUGIN") != "0" else []),
    install_requires=[
        "numpy>=1.24",
        "cffi>=1.15.1",
        "click>=8.1",
        "psutil>=5.9",
        "nvidia-ml-py>=12.535",
        "prometheus-client>=0.16",
    ],
    extras_require={
        # PyPI only has pyslurm for Slurm 25.11; nothing requires it.
        "pyslurm": ["pyslurm"],
        # coda-slurm simulate --plot
        "plot": ["matplotlib>=3.6"],
        "test": [
            "pytest>=7.4",
            "ruff>=0.4",
            "jsonschema>=4.0",
            "matplotlib>=3.6",
            # tests/controller/test_clients_slurm.py submits through the clients users really use.
            "submitit>=1.5",
            "dask-jobqueue>=0.8",
            "distributed>=2024.1",
        ],
    },
    entry_points={
        "console_scripts": [
            "coda-slurm=slurm_plugin.cli.main:main",
            "coda-node=coda_node.cli:main",
        ],
    },
    zip_safe=False,
)
