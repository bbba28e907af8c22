"""The store fixtures of the batch tests (tests/spark/conftest.py), for the readers here."""

from tests.spark.conftest import any_store, file_store, quire_spark, stream_cluster  # noqa: F401
