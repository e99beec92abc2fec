"""`python -m kernelagent`: the same as the `kernelagent` command."""

from kernelagent.cli import main

if __name__ == "__main__":
    main()
