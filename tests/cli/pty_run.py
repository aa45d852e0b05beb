#!/usr/bin/env python3
"""Runs a command on a pseudo-terminal, as a user at a terminal would.

    pty_run.py [--timeout S] [--prompt TEXT]... [--send LINE]... -- CMD [ARGS]

Each --send LINE is typed (followed by Enter) once the output shows one
more prompt (any of the PROMPT texts) than before (immediately when no
--prompt is given); "^C" and
"^D" send Ctrl-C and Ctrl-D without Enter. Everything the command writes
to the terminal is copied to stdout (CR LF as LF). Exits with the
command's exit status, 128 + signal when killed by one, or 124 after
--timeout seconds (the command is then killed).
"""
import argparse
import os
import pty
import select
import signal
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--prompt", action="append", default=[])
    ap.add_argument("--send", action="append", default=[])
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(cmd[0], cmd)
    out = b""
    todo = list(a.send)
    prompts_seen = 0
    deadline = time.monotonic() + a.timeout
    status = None
    while True:
        if todo:
            shown = sum(out.count(p.encode()) for p in a.prompt)
            ready = not a.prompt or shown > prompts_seen
            if ready:
                line = todo.pop(0)
                prompts_seen += 1
                if line == "^C":
                    os.write(fd, b"\x03")
                elif line == "^D":
                    os.write(fd, b"\x04")
                else:
                    os.write(fd, line.encode() + b"\r")
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            sys.stdout.write(out.decode(errors="replace").replace("\r\n", "\n"))
            sys.stdout.write("\n[pty_run: timed out after %gs]\n" % a.timeout)
            return 124
        r, _, _ = select.select([fd], [], [], min(left, 0.05))
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the command closed the terminal
                chunk = b""
            if not chunk:
                break
            out += chunk
    _, status = os.waitpid(pid, 0)
    sys.stdout.write(out.decode(errors="replace").replace("\r\n", "\n"))
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main())
