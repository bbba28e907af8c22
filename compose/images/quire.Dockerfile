# The quire image of compose/ci.yml: compose/Dockerfile's layout (code in /opt/quire,
# installed editable; uid 10001; tini) on the pydeps image instead of python:3.11-slim.
ARG DEPS
FROM ${DEPS}
WORKDIR /opt/quire
COPY . /opt/quire/
RUN pip install --no-index --no-deps --no-build-isolation -e . && quire --help >/dev/null
USER quire
WORKDIR /var/lib/quire
ENTRYPOINT ["tini", "--"]
CMD ["quire", "--help"]
