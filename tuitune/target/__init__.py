"""The target side: how commands reach the GPU box (local or SSH), the SSH config and host-key
trust, following the log, controlling the server (launch, stop, drift, locks), clusters, GPU
telemetry and the live session. ``remote/`` holds the scripts that run *on* the target."""
