# The object store of compose/ci.yml: moto_server, the S3 server the test suite uses (no
# MinIO server can be installed here), on the pydeps image's Python.
ARG DEPS
FROM ${DEPS}
COPY wheels /tmp/wheels
RUN pip install --no-index --find-links /tmp/wheels -r /tmp/wheels/requirements.txt \
 && rm -rf /tmp/wheels
USER quire
EXPOSE 9000
ENTRYPOINT ["tini", "--"]
CMD ["moto_server", "-H", "0.0.0.0", "-p", "9000"]
