"""`python -m simcluster ...`: the same command line as the `simcluster` script (useful where
the script is not on PATH, e.g. a wheel installed with `pip install --target`)."""

from simcluster.cli import main

if __name__ == "__main__":
    main()
