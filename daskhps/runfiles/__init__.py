"""What a run leaves on disk, and the one place that reads and writes it.

Training, retraining, re-sharding, sizing and serving all read a run through these modules,
and this package imports none of them (only the stores' format below it, ``daskhps.tiers``,
and the config it records)::

    rundir      a run directory: what it holds, the rules that keep a trained model
                (--resume, --overwrite, a retraining folder left alone)
    checkpoint  a checkpoint folder: its files, how it becomes visible, how to find one
    manifest    MANIFEST.json, field by field
    locations   where a checkpoint's stores are, recorded relative to its run folder
    published   the names a retraining folder gives its published versions
    replica     the copy at checkpoint.replicate_to: its layout, writing and restoring it
    copycache   a copy in object storage read through a bounded cache on local disk
    reading     a checkpoint's stores where they lie, or from the copy

Nothing is imported here: importing one module must not pull in the others (the copy's
needs fsspec, a checkpoint's torch).
"""
