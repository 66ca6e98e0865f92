"""What the preview tests share: the agent's script that waits until its servers listen."""

from __future__ import annotations

# Run by the agent (python3 -c WAIT_LISTENING PORT...): returns once each port takes a connection on
# the sandbox's loopback, fails after 20 s.
WAIT_LISTENING = """
import socket, sys, time
deadline = time.monotonic() + 20
for port in map(int, sys.argv[1:]):
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {port}"
            time.sleep(0.1)
"""
