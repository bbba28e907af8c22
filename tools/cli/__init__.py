"""The `quire` command line (layer 5): verbs over quire.client, tables/json/yaml.

Never imports a role package: role commands (`quire coordinator`, `quire spark`, `quire
bench`, ...) join through the `quire.commands` entry points, and `quire up` starts the
roles as subprocesses (tools.local_cluster).
"""
