"""The target side: how commands reach the GPU box (local or SSH), the SSH config and host-key
trust, following the log, controlling the server (launch, stop, drift, locks), clusters, GPU
telemetry and the live session. ``remote/`` holds the scripts that run *on* the target."""

import warnings

# asyncssh still imports DSA's classes, which cryptography 45+ marks deprecated: ten lines of
# warnings on stderr at every SSH command, about nothing tuitune uses (DSA keys are refused by
# OpenSSH since 7.0)
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh\.")
