"""The `quire` command line (layer 5): never imports a role package."""
