"""End-to-end jobs composed from the library: training, scheduled retraining, batch scoring.

Each job is a thin composition over :mod:`daskhps`; the command line calls into them.
"""
