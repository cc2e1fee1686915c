"""``daskhps import``: existing embeddings as the starting state of a run's tables.

Modules: ``source`` (a chunk of rows, the inputs' common interface and which one ``--rows``
names), ``npy`` and ``parquet`` (the two inputs, read in chunks); ``tables`` (which files are
which table's: ``TABLE=PATH`` with several tables); ``checks`` (each chunk's values: finite
floats, a sound optimizer state, distinct keys, each key its table's); ``staged`` (the rank
stores, written in a staging folder, each row routed to its owner); ``job`` (the order of
work: check, stage, move into place; docs/serving.md, "Import"); ``command`` (the command
line).
"""

from daskhps.importing.job import ImportResult, import_table, import_tables
from daskhps.importing.source import open_source
from daskhps.importing.tables import open_sources

__all__ = ["ImportResult", "import_table", "import_tables", "open_source", "open_sources"]
