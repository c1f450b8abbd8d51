"""Measuring: log lines into events, metric windows, statistics, the load generator (bench), the
/metrics scraper, nvidia-smi readings, the runs table, captures and their reports. No SSH here:
what is measured comes in as lines, pages and HTTP."""
