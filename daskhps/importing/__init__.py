"""``daskhps import``: existing embeddings as the starting state of a run's table.

Modules: ``sources`` reads the inputs (the .npy pair ``daskhps export`` writes, or parquet) in
chunks; ``checks`` checks each chunk's values (finite floats, a sound optimizer state, distinct
keys); ``staged`` writes the rank stores in a staging folder, each row routed to its owner;
``job`` orders the work (check, stage, move into place; docs/serving.md, "Import");
``command`` is the command line.
"""

from daskhps.importing.job import ImportResult, import_table
from daskhps.importing.sources import open_source

__all__ = ["ImportResult", "import_table", "open_source"]
