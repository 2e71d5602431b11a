"""What tests and scripts share: model builders, repositories, ports, clocks, load, faults and the fuzzer.

Scripts import it as ``tests.support`` (run them from the repository root as
``python -m scripts.<name>``); nothing here edits ``sys.path``.
"""
