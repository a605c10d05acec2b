"""The ``ghofl`` command line: client statistics, aggregation, fitting, evaluation, simulation.

The entry point is :func:`ghofl.cli.main.main`; the typer application is
:data:`ghofl.cli.app.app`, and each group of subcommands lives in its own module that registers
onto it. Only this package (and the benchmark runner) writes to the terminal.
"""
