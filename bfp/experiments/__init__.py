"""Experiment matrices: the seeds' claims rerun on real data with one command.

    python -m bfp.experiments run cifar10-table --data DIR_OR_TARBALL
    python -m bfp.experiments report cifar10-table

``matrix`` holds the rows (each one ``cifar.py`` command line), ``runner``
runs them resumably, ``results`` turns a run directory into a small JSON
result, ``report`` renders docs/RESULTS.md with its curves. This package sits
on top of the command line: it runs ``cifar.py`` processes and imports nothing
of the CLI.
"""
