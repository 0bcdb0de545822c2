"""``python -m runjournal`` — same as the ``runjournal`` console script."""

from runjournal.cli import main

main()
