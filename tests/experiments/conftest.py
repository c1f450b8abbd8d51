"""Tests of tuitune.experiments: `ab`, `sweep` (and `--live`), `tune` and its replay, `record`, `watch`,
nccl-bench, and the verdicts they print."""
