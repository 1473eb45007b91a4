"""Arguments for a pytest run of its own (a child process that a test starts and reads)."""

# Hypothesis' pytest plugin imports all of Hypothesis (about 2 CPU-seconds a process); no child run
# here uses it.
NO_HYPOTHESIS = ("-p", "no:hypothesispytest")
