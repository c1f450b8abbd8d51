"""Tests of tuitune.tui: Pilot tests against the live simulator and on replays, the SVG snapshots
(__snapshots__/, per test module, pytest-textual-snapshot), the screenshots, the real demo in tmux."""
