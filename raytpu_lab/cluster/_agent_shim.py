"""The command an emulated host's raylet runs for each of its Ray agents (standalone: it imports
nothing of raytpu_lab or Ray, and runs under ``python -S``, so it costs a few MB).

``python -S _agent_shim.py <agent script> <args...>``: asks the cluster's agent fork server
(``$RAYTPU_AGENT_FORKSERVER``, see :mod:`raytpu_lab.cluster._agent_forkserver`) to fork the agent
with this process's streams, environment and directory, then stays until the agent ends,
forwarding signals to it, and exits with its exit code. Without a server it ``exec``s the agent as
Ray would have (``python -u <agent script> <args...>``).
"""

import json
import os
import signal
import socket
import sys
import time

_ENV = "RAYTPU_AGENT_FORKSERVER"


def _exec_agent(argv):
    os.execv(sys.executable, [sys.executable, "-u", *argv])


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (ended, not yet reaped by the server) counts as ended
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main(argv):
    path = os.environ.get(_ENV, "")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(10.0)
        sock.connect(path)
        body = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
        socket.send_fds(sock, [b"%08d" % len(body)], [0, 1, 2])
        sock.sendall(body)
        reader = sock.makefile("r")
        first = reader.readline()
        pid = int(json.loads(first)["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        sock.close()
        _exec_agent(argv)
        return 1  # not reached

    def forward(sig, _frame):
        try:
            os.kill(pid, sig)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                signal.SIGUSR2):
        signal.signal(sig, forward)
    sock.settimeout(None)
    while True:
        try:
            line = reader.readline()
        except InterruptedError:
            continue
        except OSError:
            line = ""
        if not line:
            break
        try:
            code = int(json.loads(line)["exit"])
        except (ValueError, KeyError, TypeError):
            continue
        if code < 0:  # the agent was killed by a signal: end the same way
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        return code
    # The server went away before the agent ended: stay while the agent lives.
    while _alive(pid):
        time.sleep(0.5)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
