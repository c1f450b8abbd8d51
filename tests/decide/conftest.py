"""Tests of tuitune.decide: the cost model, `advise` and the schedules it emits, fitted on the
simulator's captures and on the real engines' recorded ones (tests/data/)."""
