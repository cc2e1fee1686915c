"""Training runs: the driver, the pass pipeline, and what a run leaves on disk.

Modules in the order a run meets them (nothing is imported here: importing a module of this
package must not pull in the trainer, which needs dask)::

    rundir      what a run directory holds; the rules that keep a trained model
    trainer     the driver: checks, cluster, the run's hosts, then pass after pass
    pipeline    every pass: prepare, stage ahead, activate, train, release
    examples    a pass's examples routed to the worker that trains them, cut into batches
    worker      the dense replica and the mini-batch loop of each rank
    holdout     the holdout, evaluated in chunks
    metrics     AUC, logloss, normalized entropy, calibration
    records     the typed records of a pass, up to the line in metrics.jsonl
    checkpointer, checkpoint, manifest
                taking a checkpoint of a live run; what one holds on disk; MANIFEST.json
    changes, resume
                which config changes a continued run accepts; re-sharding on resume
    inspection  ``daskhps inspect``: what checkpoints hold, read only
    killpoints  named kill points for the crash-resume tests
"""
