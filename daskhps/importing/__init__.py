"""``daskhps import``: existing embeddings as the starting state of a run's table.

Modules: ``source`` (a chunk of rows, the inputs' common interface and which one ``--rows``
names), ``npy`` and ``parquet`` (the two inputs, read in chunks); ``checks`` (each chunk's
values: finite floats, a sound optimizer state, distinct keys); ``staged`` (the rank stores,
written in a staging folder, each row routed to its owner); ``job`` (the order of work: check,
stage, move into place; docs/serving.md, "Import"); ``command`` (the command line).
"""

from daskhps.importing.job import ImportResult, import_table
from daskhps.importing.source import open_source

__all__ = ["ImportResult", "import_table", "open_source"]
