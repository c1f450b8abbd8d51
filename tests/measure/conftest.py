"""Tests of tuitune.measure: the log parser, the bench and its concurrency, captures, workloads, the
acceptance guard, the engine's own counters, the metrics store and statistics, and bytes from outside
treated as hostile."""
