"""Readers of the corpora's file formats into rows of the ingest tables: pandas only, no Spark, nothing of ``jobs``.

:mod:`readers.corpora` holds the formats and the paper's protocol (splits, duplicates, the factual corpus P);
:mod:`readers.errors` the one error they raise, a file that cannot be read as its format says. ``erg ingest``
(:mod:`jobs.ingest`) turns what they return into Delta tables.
"""
