"""The persisting-L2 reset the timer runs before every timed call (child/timing.py): a
persisting-L2 access-policy window survives the L2 flush, so the driver's state is put back to
normal first. Imported by timing.py before any candidate exists; the current-stream getter is
bound at that moment."""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import torch

from kernelagent.harness.child import transfer

_current_stream = torch.cuda.current_stream  # bound now, before any candidate code runs


class PersistingL2:
    """Undoes a persisting-L2 setup before a timed call, through the driver (child/transfer.py's
    libcuda loader): persisting lines back to normal (`cuCtxResetPersistingL2Cache`), the
    persisting carve-out back to 0 bytes, the current stream's access-policy window cleared.
    Lines marked persisting survive the flush's writes, so without this a kernel that set a window
    (or one left over from an earlier call) is timed from a warm L2.

    Never raises: a missing symbol or a failing call is recorded in `status` and that step is
    not tried again."""

    LIMIT_PERSISTING_L2 = 0x06  # CU_LIMIT_PERSISTING_L2_CACHE_SIZE
    STREAM_ACCESS_POLICY_WINDOW = 1  # CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW
    NOT_SUPPORTED = 801  # CUDA_ERROR_NOT_SUPPORTED

    def __init__(self, loader: Callable[[], Any] = transfer.libcuda):
        self.problems: list[str] = []
        self.carveout_removed = 0  # the largest carve-out found (bytes) and set back to 0
        self._reset = self._get_limit = self._set_limit = self._set_attr = None
        try:
            lib = loader()
        except OSError as exc:
            self.problems.append(f"no CUDA driver library ({exc})")
            return
        self._reset = self._bind(lib, "cuCtxResetPersistingL2Cache", [])
        self._get_limit = self._bind(lib, "cuCtxGetLimit", [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int])
        self._set_limit = self._bind(lib, "cuCtxSetLimit", [ctypes.c_int, ctypes.c_size_t])
        self._set_attr = self._bind(lib, "cuStreamSetAttribute", [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p])
        # CUstreamAttrValue is a 64-byte union; all zeros is an access-policy window of 0 bytes
        # (no window), hit and miss properties "normal".
        self._no_window = (ctypes.c_char * 64)()
        # Its address, taken once: ctypes.addressof raises an audit event, and the candidate's
        # process runs an audit hook (defences.py) that should not be paid for on every call.
        self._no_window_at = ctypes.addressof(self._no_window)

    def _bind(self, lib: Any, name: str, argtypes: list[Any]) -> Any:
        fn = getattr(lib, name, None)
        if fn is None:
            self.problems.append(f"the driver has no {name}")
            return None
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
        return fn

    @property
    def status(self) -> str:
        """"ok" when every step worked so far, else what could not be reset."""
        return "ok" if not self.problems else "could not reset: " + "; ".join(self.problems)

    def _failed(self, code: int, what: str) -> bool:
        """True when `code` is an error: recorded, and the step is not tried again. A device
        without persisting L2 (CUDA_ERROR_NOT_SUPPORTED) has nothing to reset: not a problem."""
        if code == 0:
            return False
        if code != self.NOT_SUPPORTED:
            self.problems.append(f"{what} failed (CUresult {code})")
        return True

    def __call__(self) -> None:
        if self._reset is not None and self._failed(self._reset(), "cuCtxResetPersistingL2Cache"):
            self._reset = None
        if self._get_limit is not None and self._set_limit is not None:
            value = ctypes.c_size_t(0)
            if self._failed(self._get_limit(ctypes.byref(value), self.LIMIT_PERSISTING_L2),
                            "cuCtxGetLimit(PERSISTING_L2_CACHE_SIZE)"):
                self._get_limit = None
            elif value.value:
                self.carveout_removed = max(self.carveout_removed, int(value.value))
                if self._failed(self._set_limit(self.LIMIT_PERSISTING_L2, 0),
                                "cuCtxSetLimit(PERSISTING_L2_CACHE_SIZE, 0)"):
                    self._set_limit = None
        if self._set_attr is not None:
            stream = _current_stream().cuda_stream
            if self._failed(self._set_attr(ctypes.c_void_p(stream), self.STREAM_ACCESS_POLICY_WINDOW,
                                           self._no_window_at), "cuStreamSetAttribute(ACCESS_POLICY_WINDOW)"):
                self._set_attr = None
