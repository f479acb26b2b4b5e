"""`python -m pallas_check` is the same program as the `pallas-check` script."""

from pallas_check.cli.app import main

if __name__ == "__main__":
    main()
