"""Deciding: fitting, the cost model and the advisor. Pure models: no I/O, no sessions."""
