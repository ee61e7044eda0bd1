"""`python -m carpool` runs the console script."""

from carpool.cli import main

main()
