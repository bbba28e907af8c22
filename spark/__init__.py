"""quire batch: read journal history straight from the fragment store.

    spark.datasource   PySpark Python Data Source `quire` (spark.read.format("quire"))
    spark.dask_reader  the same reads as a Dask DataFrame / Bag, for one machine
    spark.planner      pure planning: fragment index -> input partitions (Span)
    spark.framing      executor side: fetch, decompress, frame a Span's messages
    spark.catalog      driver side: journals (selector) and their covering sets
    spark.jobs         batch pipelines, run by `quire spark run JOB`

Layer 4: imports only protocol and fragment_store (and third-party libraries).
Nothing here imports pyspark or dask at package import time.
"""
