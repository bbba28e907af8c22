"""quire's dashboards (layer 4 role): Grafana dashboards and provisioning (`grafana/`),
a Prometheus scrape config (`prometheus.yml`) and the live web dashboard (`quire dashboard`).

May import protocol and quire (the client); reads etcd itself; never another role.
"""
