"""`python -m benchmarks.serving.soak_faults`: the soak with faults (see the package's docstring)."""

from benchmarks.serving.soak_faults.run import main

main()
