import sys

argv = sys.argv[1:]
if argv[:2] == ["--sim-engine", "vllm"]:  # the vLLM dialect (see vllm.py); SGLang's is the default
    from .vllm import main

    sys.exit(main(argv))
if argv[:2] == ["--sim-engine", "sglang"]:
    argv = argv[2:]
from .server import main

sys.exit(main(argv))
