"""A real OpenSSH sshd on loopback (TESTING.md recipe): its keys, config and known_hosts in a folder
of its own; tests/conftest.py's ``sshd`` fixture and the benchmarks start one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

from tuitune_support.ports import free_port
from tuitune_support.procs import wait_for


class SshServer:
    def __init__(self, root: Path):
        import asyncssh

        self.root = root
        self.port = free_port()
        host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.host_key_path = root / "host_key"
        self.host_key_path.write_bytes(host_key.export_private_key())
        os.chmod(self.host_key_path, 0o600)
        self.host_public = host_key.export_public_key().decode().strip()
        client_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key_path = root / "id_ed25519"
        self.client_key_path.write_bytes(client_key.export_private_key())
        os.chmod(self.client_key_path, 0o600)
        (root / "authorized_keys").write_bytes(client_key.export_public_key())
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {self.host_public}\n")
        self.config = root / "sshd_config"
        self.config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.host_key_path}",
                    f"PidFile {root / 'sshd.pid'}",
                    f"AuthorizedKeysFile {root / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "AllowTcpForwarding yes",
                    "Subsystem sftp internal-sftp",
                    "MaxStartups 100:30:200",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["/usr/sbin/sshd", "-D", "-e", "-f", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "sshd.err", "ab"),
        )
        wait_for(self._accepts, 10, what="sshd to accept TCP")

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)

    def kill_connections(self) -> None:
        """Kill the per-connection sshd children (the link drops; the listener stays)."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        for pid in out.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def target(self) -> dict:
        return {
            "host": "127.0.0.1",
            "port": self.port,
            "user": "root",
            "identity_file": str(self.client_key_path),
            "known_hosts": str(self.known_hosts),
        }
