"""tuitune: live-profile and tune speculative-decoding LLM servers."""

__version__ = "0.1.0"
