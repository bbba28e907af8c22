# The quire image's lower half: Debian's Python 3.11 in a venv with the project's
# dependencies from wheels built on the host (pip in a container does not trust this
# machine's certificate chain; the wheels need no index), Java for Spark, tini. Tagged by
# the hash of the pinned requirements: rebuilt only when they change.
ARG BASE
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y python3 python3-venv tini procps \
        openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/quire --create-home quire \
 && install -d -o quire -g quire /var/lib/quire/spool /var/lib/quire/beat /var/lib/quire/flower \
        /var/lib/quire/spark-work /var/lib/quire/out /var/lib/quire/consumer
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYSPARK_PYTHON=python3 \
    SPARK_NO_DAEMONIZE=1
COPY wheels /tmp/wheels
RUN python3 -m venv /opt/venv \
 && pip install --no-index --find-links /tmp/wheels -r /tmp/wheels/requirements.txt \
 && rm -rf /tmp/wheels
