"""`python -m kernelagent.harness.server`: see main.py."""

from kernelagent.harness.server.main import main

main()
