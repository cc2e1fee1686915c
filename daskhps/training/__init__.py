"""Training runs: the driver, the pass pipeline, checkpoints taken and resumed. What a run
leaves on disk (its folder, checkpoints, the copy) is read and written through
:mod:`daskhps.runfiles`.

Modules in the order a run meets them (nothing is imported here: importing a module of this
package must not pull in the trainer, which needs dask)::

    parts       what a run builds from its config, one method per component
    preflight   the checks before a run writes anything
    trainer     the driver: checks, cluster, the run's hosts, then pass after pass
    placement   which worker trains which rank, from what each worker's disk holds
    loop        one attempt of a run on its process group: pass after pass
    pipeline    every pass: prepare, stage ahead, activate, train, release
    examples    a pass's examples routed to the worker that trains them, cut into batches
    worker      the dense replica and the mini-batch loop of each rank
    holdout     the holdout, evaluated in chunks
    metrics     AUC, logloss, normalized entropy, calibration
    records     the typed records of a pass, up to the line in metrics.jsonl
    checkpointer
                taking a checkpoint of a live run
    changes, resume
                which config changes a continued run accepts; re-sharding on resume
    recovery    a lost worker: what may be retried, the record of each restart
    inspection  ``daskhps inspect``: what checkpoints hold, read only
    killpoints  named kill points for the crash-resume tests
"""
