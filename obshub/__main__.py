"""``python -m obshub``: the same as the ``obshub`` command."""

from obshub.cli import main

main()
