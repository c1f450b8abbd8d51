"""Tests of tuitune.base: the pieces every layer stands on (the one error base, TuituneError, and
the command line's mapping of it)."""
