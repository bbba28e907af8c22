# Redis from Debian's packages (bookworm: 7.0), in place of redis:7.2-alpine.
# Debian's redis-server, started without a config file as docker-compose.yml does, keeps
# protected mode on and refuses every client but loopback; the official image turns it off
# (a container's network is the boundary). The wrapper first on PATH does the same.
ARG BASE
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && printf '#!/bin/sh\nexec /usr/bin/redis-server "$@" --protected-mode no\n' > /usr/local/bin/redis-server \
 && chmod 755 /usr/local/bin/redis-server
EXPOSE 6379
CMD ["redis-server"]
