"""The command line's command bodies, one module per command family (cli.py parses and dispatches)."""
