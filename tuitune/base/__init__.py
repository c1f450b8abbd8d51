"""The bottom layer: events (the one vocabulary every layer speaks), JSON lines, asyncio helpers,
secret masking and line clipping. Imports nothing else of tuitune."""
