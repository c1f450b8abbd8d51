"""Tests of tuitune.sim, the simulator that stands in for the engines: as a real process, its batch
model as pure functions, across nodes."""
