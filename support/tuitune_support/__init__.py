"""tuitune's test and benchmark support (not part of tuitune): the real engines' builders
(``python -m tuitune_support.real_vllm`` and the others), the simulator as a process, a real sshd,
preset factories, the independent stream client, ports and waits. Installed editable from
``support/`` by `make test` and `make demo-vllm` / `make demo-sglang`."""
