"""The suites that write BENCHMARKS.md: build the runs, rank their training rows, check verdicts, verify."""
