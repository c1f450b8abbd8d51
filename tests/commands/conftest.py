"""Tests of tuitune.commands and tuitune.cli at the command line's level: `python -m tuitune ...` as a
new user and an operator run it (output, listings, completion, one-sentence refusals)."""
