"""Tests of tuitune.probe, the profiling probe inside the engine: stand-in SGLang and vLLM trees on
the host clock, `probe check` against the real source."""
