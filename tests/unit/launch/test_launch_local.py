"""Local stand-ins for SSH connections: run the exact remote command and payload with bash here.

Shared by the launch unit tests: what sshd would do (run the command with the login shell,
pipe stdin, keep stderr, the event channel, apart from stdout) minus the network.
"""

from __future__ import annotations
