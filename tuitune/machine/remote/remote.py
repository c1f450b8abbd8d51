"""Helpers that run on the target with the server's python (stdlib only), sent as ``python -c``.

Everything they need arrives as arguments, never inside shell code.

``lock PATH INFO``: take an exclusive ``flock`` on PATH without waiting; print ``LOCKED`` and
hold it until killed (the transport's lifeline kills it when tuitune lets go, exits or loses
the link, so a crashed client never leaves the lock behind); or print ``BUSY`` and the holder's
INFO, which the holder wrote into the file. Taking the lock and writing INFO happen under a
second, short-lived ``flock`` (PATH.gate), under which a caller that finds the lock taken also
reads INFO: it always reads the holder's complete INFO, never an empty file or the note of a
holder before it.

``owner PORT``: the processes that hold a listening TCP socket on PORT, as one JSON line:
``[{"pid", "sid", "ancestors", "argv"}]`` (from /proc/net/tcp{,6} and /proc/*/fd); it is how
tuitune proves that a port belongs to the process it started, or one of its children.

``models [H:]PATH...``: what each model path is on the target, as one JSON line: ``{"paths":
[{"kind": "dir" | "file" | "none", "cached": bool}], "hub": null | "ok" | REASON}``. Run in the
server's working directory with the preset's environment (relative paths, HF_HOME, HF_ENDPOINT as
the engine will see them). ``cached``: a path named like a Hugging Face id has a snapshot in the
Hub cache. A path given as ``H:PATH`` that is neither there nor cached would be fetched from the
Hub: then ``hub`` says whether the Hub answers (a TCP connection to HF_ENDPOINT's host within
HUB_WAIT_S, or "offline" when HF_HUB_OFFLINE is set), else it is null.
"""

import fcntl
import json
import os
import sys
import time

GATE_WAIT_S = 10.0  # the gate is held for microseconds; only a stopped process holds it longer
HUB_WAIT_S = 5.0  # a Hub that has not answered a TCP connection by then would not serve a model either


def lock(path, info):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    gate = os.open(path + ".gate", os.O_RDWR | os.O_CREAT, 0o600)  # (a file, not the directory: NFS)
    deadline = time.monotonic() + GATE_WAIT_S
    while True:
        try:
            fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:  # held (for microseconds); any other error is raised at once
            if time.monotonic() > deadline:
                raise OSError("%s.gate stayed locked for %.0f s" % (path, GATE_WAIT_S)) from None
            time.sleep(0.005)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        sys.stdout.write("BUSY " + os.read(fd, 4096).decode("utf-8", "replace").strip() + "\n")
        return
    else:
        os.ftruncate(fd, 0)
        os.write(fd, info.encode())
    finally:
        os.close(gate)  # releases the gate: the note is complete before anyone can look
    sys.stdout.write("LOCKED\n")
    sys.stdout.flush()
    while True:
        time.sleep(3600)


def _stat(pid):
    with open("/proc/%s/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[3])  # ppid, session id


def owner(port):
    inodes = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add("socket:[%s]" % cols[9])
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir("/proc/%s/fd" % pid)
            if not any(os.readlink("/proc/%s/fd/%s" % (pid, fd)) in inodes for fd in fds):
                continue
            ppid, sid = _stat(pid)
            ancestors, p = [], ppid
            while p > 1 and len(ancestors) < 64:
                ancestors.append(p)
                p = _stat(p)[0]
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue  # gone meanwhile, or not ours to read
        found.append({"pid": int(pid), "sid": sid, "ancestors": ancestors, "argv": argv})
    print(json.dumps(found))


def _hub_cache():
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return os.path.expanduser(env["HF_HUB_CACHE"])
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def _hub_answers():
    """None when the Hub's host accepts a TCP connection, else why not, in a few words."""
    import socket
    import threading
    from urllib.parse import urlsplit

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on"):
            return "offline: %s is set" % name
    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = url.hostname or "huggingface.co"
    try:
        port = url.port or (80 if url.scheme == "http" else 443)
    except ValueError:
        return "HF_ENDPOINT %s has no valid port" % url.geturl()
    said = ["no answer within %g s" % HUB_WAIT_S]

    def attempt():  # in a thread: a resolver that hangs is bounded too
        try:
            socket.create_connection((host, port), HUB_WAIT_S).close()
            said[0] = None
        except socket.gaierror:
            said[0] = "not a known host name"
        except ConnectionRefusedError:
            said[0] = "connection refused"
        except socket.timeout:
            pass
        except OSError as e:
            said[0] = e.strerror or str(e)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(HUB_WAIT_S + 1)
    return None if said[0] is None else "%s:%d: %s" % (host, port, said[0])


def models(specs):
    out, ask = [], False
    for spec in specs:
        hub, path = (True, spec[2:]) if spec.startswith("H:") else (False, spec)
        full = os.path.expanduser(path)
        kind = "dir" if os.path.isdir(full) else ("file" if os.path.exists(full) else "none")
        snap = os.path.join(_hub_cache(), "models--" + path.replace("/", "--"), "snapshots")
        cached = path.count("/") <= 1 and os.path.isdir(snap) and bool(os.listdir(snap))
        out.append({"kind": kind, "cached": cached})
        ask = ask or (hub and kind == "none" and not cached)
    why = _hub_answers() if ask else None
    print(json.dumps({"paths": out, "hub": (why or "ok") if ask else None}))


if __name__ == "__main__":
    try:
        if sys.argv[1] == "lock":
            lock(sys.argv[2], sys.argv[3])
        elif sys.argv[1] == "owner":
            owner(int(sys.argv[2]))
        elif sys.argv[1] == "models":
            models(sys.argv[2:])
    except Exception as e:  # one line for tuitune, which reads one line
        print("ERROR %s: %s" % (type(e).__name__, e), flush=True)
        sys.exit(1)
