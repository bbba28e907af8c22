"""quire batch: read journal history straight from the fragment store.

    spark.datasource   PySpark Python Data Source `quire` (spark.read / readStream .format("quire"))
    spark.stream       the Structured Streaming source: offset maps, heads, micro-batch partitions
    spark.stream_plan  driver side of a stream (Spark's source and Dask's query): heads, ends, parts
    spark.stream_options  the stream-only options (brokers, startingOffsets, maxBytesPerTrigger)
    spark.offsets      pure micro-batch planning: {journal: offset} maps -> store spans + tails
    spark.tail         executor side: a micro-batch's unpersisted tail, read from the coordinators
    spark.sink         df.write / writeStream .format("quire"): rows appended to journals
    spark.appender     rows -> messages per journal -> one append per journal per task
    spark.dask_writer  to_quire: the same write path for a Dask DataFrame
    spark.dask_reader  the same reads as a Dask DataFrame / Bag, for one machine
    spark.dask_stream  a streaming query on Dask: micro-batches into a journal, exactly once
    spark.dask_checkpoint  its checkpoint directory (query id, offsets and commits per batch)
    spark.planner      pure planning: fragment index -> input partitions (Span)
    spark.framing      executor side: fetch, decompress, frame a Span's messages
    spark.catalog      driver side: journals (selector) and their covering sets
    spark.jobs         batch pipelines, run by `quire spark run JOB`

Layer 4: imports protocol and fragment_store (and third-party libraries); the streaming
modules (stream, stream_plan, tail) and the writers (appender) also import quire.client, the batch modules never do.
Nothing here imports pyspark or dask at package import time.
"""
