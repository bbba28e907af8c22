# etcd from Debian's packages (bookworm: etcd 3.4), for compose/ci.yml in place of
# quay.io/coreos/etcd. docker-compose.yml starts /usr/local/bin/etcd and configures it
# with ETCD_* variables only, which 3.4 reads as 3.5 does.
ARG BASE
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server etcd-client \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s /usr/bin/etcd /usr/local/bin/etcd && ln -s /usr/bin/etcdctl /usr/local/bin/etcdctl
ENV ETCDCTL_API=3
EXPOSE 2379 2380
CMD ["/usr/local/bin/etcd"]
