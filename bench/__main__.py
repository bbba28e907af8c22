"""`python -m bench` is `quire bench`."""

from .main import main

main()
