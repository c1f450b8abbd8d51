"""Tests of tuitune.engines: what each engine module provides, vLLM as the second engine, ngram and
suffix decoding, vLLM's dynamic schedule, and tuitune's vLLM knowledge against the release's own source
and command line."""
