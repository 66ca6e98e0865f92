"""The code interpreter (``run_code``): a Jupyter kernel per named context, started on first use as
the agent through the process table, and its results in E2B's shape. docs/code.md."""
