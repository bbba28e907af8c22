"""quire's dashboards: Grafana dashboards and provisioning (`grafana/`), a Prometheus
scrape config (`prometheus.yml`) and the live web dashboard (`quire dashboard`)."""
