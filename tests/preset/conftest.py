"""Tests of tuitune.preset: shipped presets, round trips, rendering, lint, multi-node presets."""
