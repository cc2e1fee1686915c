"""The package version: its own module, so that modules written by the package (checkpoints,
exports) can stamp it without importing the package's ``__init__`` (which imports the trainer
on ``daskhps.train``)."""

__version__ = "0.1.0"
