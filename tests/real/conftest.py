"""Tests against the real engines: vLLM's CPU build and SGLang's CPU kernels, built once in .cache/ by
tuitune_support.real_vllm and tuitune_support.real_sglang (`make test` builds them first)."""
