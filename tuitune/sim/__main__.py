import sys


def _main(argv: list[str]) -> int:
    if argv[:2] == ["--sim-engine", "vllm"]:  # the vLLM dialect (see vllm.py); SGLang's is the default
        from tuitune.sim.vllm import main as vllm_main

        return vllm_main(argv)
    if argv[:2] == ["--sim-engine", "sglang"]:
        argv = argv[2:]
    from tuitune.sim.server import main

    return main(argv)


sys.exit(_main(sys.argv[1:]))
