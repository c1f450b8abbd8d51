"""Tests of tuitune.machine: transports and server control (a real sshd on loopback, the simulator as
a process), sessions, ownership and adoption, discovery, multi-node, telemetry, the switch, and what
broke under faults or at a first contact with a real engine."""
