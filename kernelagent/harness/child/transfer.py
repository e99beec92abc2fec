"""Moving tensors from the candidate's process to the trusted reference process, without pickle.

Only plain, dense `torch.Tensor` objects cross: subclasses, lazy wrappers and anything else are
refused before anything is sent. What crosses is described in JSON (protocol.py) and rebuilt
from raw memory on the other side, so no object of the candidate's ever runs code in a trusted
process.

Two ways across, both relayed by the server (the candidate holds no channel to the reference):
- "ipc" (CUDA): the CUDA IPC handle of the allocation that holds the tensor, its byte offset,
  shape and dtype. The reference opens it with the driver API (`cuIpcOpenMemHandle`) and reads
  the bytes in place: no copy on either side. The sender keeps the tensor alive until the
  reference has answered. torch's own IPC rebuild is not used: it needs a reference-count file
  in the sender's /dev/shm, which is private to the candidate's sandbox, and it runs code named
  by the sender.
- "bytes" (CPU, or CUDA when IPC is off): the tensor's bytes as a payload frame after the
  message (CPU mode uses small inputs).
"""

from __future__ import annotations

import base64
import ctypes
from dataclasses import dataclass, field
from typing import Any

import torch

# Largest tensor the CPU path sends as bytes (a frame must fit protocol.MAX_PAYLOAD_FRAME).
MAX_BYTES_TENSOR = 1 << 30
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _DTYPES[_name] = getattr(torch, _name)


class OutputTypeError(Exception):
    """The candidate returned something that is not a plain dense tensor (or tuple of them)."""


class TransferError(ValueError):
    """A description from the candidate's process that does not describe tensors we can read."""


def flatten_outputs(value: Any) -> list[torch.Tensor]:
    """The output as a list of tensors; raises OutputTypeError for anything unusual."""
    items = list(value) if isinstance(value, (tuple, list)) else [value]
    tensors = []
    for index, item in enumerate(items):
        where = f"output[{index}]" if isinstance(value, (tuple, list)) else "the output"
        if type(item) is not torch.Tensor:  # exact type: no subclasses, no lazy proxies
            raise OutputTypeError(
                f"{where} is a {type(item).__module__}.{type(item).__qualname__}; "
                "only plain torch.Tensor outputs are accepted"
            )
        if item.layout is not torch.strided or item.is_sparse or item.is_meta:
            raise OutputTypeError(f"{where} is not a dense strided tensor (layout {item.layout})")
        if item.is_nested or item.is_quantized:
            raise OutputTypeError(f"{where} is a nested or quantized tensor")
        tensors.append(item)
    return tensors


@dataclass
class Outgoing:
    """What the sender sends: JSON records, payload frames, and what must stay alive."""

    records: list[dict[str, Any]]
    payloads: list[memoryview | bytes] = field(default_factory=list)
    keepalive: list[Any] = field(default_factory=list)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def describe(tensors: list[torch.Tensor], use_ipc: bool) -> Outgoing:
    """Describe `tensors` for `receive` in the reference process. No copy is made of a
    contiguous CUDA tensor; a non-contiguous one is made contiguous once."""
    out = Outgoing(records=[])
    for tensor in tensors:
        meta = {"shape": list(tensor.shape), "dtype": _dtype_name(tensor.dtype), "device": tensor.device.type}
        owned = tensor.detach()
        if not owned.is_contiguous():
            owned = owned.contiguous()
        nbytes = owned.numel() * owned.element_size()
        handle, base_offset = None, 0
        if use_ipc and owned.is_cuda and nbytes:
            # The driver's handle of the allocation, not torch's `_share_cuda_()`: torch's sharing
            # parks every shared block in a limbo until the receiver decrements a reference count
            # through torch's own IPC rebuild, which the reference never runs; each check then
            # leaked its outputs and inputs (KernelBench's 6 GiB problems ran out of memory at
            # the third trial).
            with torch.cuda.device(owned.device):
                handle, base_offset = _CudaIpc.export(owned.data_ptr())
        if handle is not None:
            out.keepalive.append(owned)
            out.records.append({**meta, "kind": "ipc", "handle": base64.b64encode(bytes(handle)).decode(),
                                "offset": base_offset, "nbytes": nbytes})
        else:
            host = owned.to("cpu") if owned.is_cuda else owned
            if nbytes > MAX_BYTES_TENSOR:
                raise OutputTypeError(f"a {nbytes}-byte tensor is too large to send without CUDA IPC")
            flat = host.reshape(-1).view(torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
            out.keepalive.append(flat)
            out.payloads.append(memoryview(flat.numpy()) if nbytes else b"")
            out.records.append({**meta, "kind": "bytes", "nbytes": nbytes})
    return out


def release(outgoing: Outgoing) -> None:
    outgoing.keepalive.clear()
    outgoing.payloads.clear()


# --------------------------------------------------------------------------------------
# The receiving side (reference process)
# --------------------------------------------------------------------------------------

_LIBCUDA: Any = None


def libcuda() -> Any:
    """The CUDA driver library (ctypes), loaded once per process. Raises OSError where there is
    none. Shared with child/persisting_l2.py (the timer's persisting-L2 reset), so there is one loader."""
    global _LIBCUDA
    if _LIBCUDA is None:
        _LIBCUDA = ctypes.CDLL("libcuda.so.1")
    return _LIBCUDA


class _CudaIpc:
    """cuIpcOpenMemHandle / cuIpcCloseMemHandle through the driver library."""

    _lib: Any = None

    class Handle(ctypes.Structure):
        _fields_ = [("reserved", ctypes.c_char * 64)]

    @classmethod
    def lib(cls) -> Any:
        if cls._lib is None:
            lib = libcuda()
            opener = getattr(lib, "cuIpcOpenMemHandle_v2", None) or lib.cuIpcOpenMemHandle
            opener.argtypes = [ctypes.POINTER(ctypes.c_uint64), cls.Handle, ctypes.c_uint]
            opener.restype = ctypes.c_int
            lib.cuIpcCloseMemHandle.argtypes = [ctypes.c_uint64]
            lib.cuIpcCloseMemHandle.restype = ctypes.c_int
            ranger = getattr(lib, "cuMemGetAddressRange_v2", None) or lib.cuMemGetAddressRange
            ranger.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
            ranger.restype = ctypes.c_int
            lib.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(cls.Handle), ctypes.c_uint64]
            lib.cuIpcGetMemHandle.restype = ctypes.c_int
            cls._lib, cls._open, cls._range = lib, opener, ranger
        return cls._lib

    @classmethod
    def export(cls, ptr: int) -> tuple[bytes | None, int]:
        """(the IPC handle of the allocation holding `ptr`, `ptr`'s offset in it); (None, 0)
        where the memory cannot be exported (expandable segments, managed memory): then the
        tensor crosses as bytes."""
        lib = cls.lib()
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        if cls._range(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)) != 0:
            return None, 0
        raw = cls.Handle()
        if lib.cuIpcGetMemHandle(ctypes.byref(raw), base) != 0:
            return None, 0
        return ctypes.string_at(ctypes.addressof(raw), 64), int(ptr - base.value)  # all 64 bytes, NULs included

    @classmethod
    def open(cls, handle: bytes) -> int:
        cls.lib()
        raw = cls.Handle()
        ctypes.memmove(ctypes.addressof(raw), handle, 64)
        ptr = ctypes.c_uint64()
        code = cls._open(ctypes.byref(ptr), raw, ctypes.c_uint(1))  # LAZY_ENABLE_PEER_ACCESS
        if code != 0:
            raise TransferError(f"cuIpcOpenMemHandle failed (CUresult {code})")
        return int(ptr.value)

    @classmethod
    def close(cls, ptr: int) -> None:
        cls.lib().cuIpcCloseMemHandle(ctypes.c_uint64(ptr))


class _DeviceBytes:
    """`nbytes` bytes of device memory at `ptr`, as a uint8 tensor without a copy."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 2, "strides": None}


@dataclass
class Incoming:
    """Tensors rebuilt in the reference process. Call close() when done with them: IPC
    mappings are unmapped there."""

    tensors: list[dict[str, Any]]
    mapped: list[int] = field(default_factory=list)

    def close(self) -> None:
        self.tensors.clear()
        if self.mapped:
            torch.cuda.synchronize()
            for ptr in self.mapped:
                _CudaIpc.close(ptr)
            self.mapped.clear()


def _check_record(record: Any) -> tuple[list[int], torch.dtype, int]:
    if not isinstance(record, dict):
        raise TransferError("a tensor description must be an object")
    shape, dtype_name, nbytes = record.get("shape"), record.get("dtype"), record.get("nbytes")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                              for s in shape) or len(shape) > 16:
        raise TransferError("bad shape in a tensor description")
    if dtype_name not in _DTYPES:
        raise TransferError(f"unsupported dtype {str(dtype_name)[:30]!r}")
    dtype = _DTYPES[dtype_name]
    numel = 1
    for s in shape:
        numel *= s
    expected = numel * torch.empty(0, dtype=dtype).element_size()
    if nbytes != expected:
        raise TransferError("a tensor description's byte count does not match its shape")
    return shape, dtype, expected


def receive(records: list[Any], payloads: list[bytes], device: torch.device) -> Incoming:
    """Rebuild what the candidate's process described (`describe`), on `device`. Returns
    {"tensor", "shape", "dtype", "device"} records, "device" as the sender reported it."""
    if not isinstance(records, list) or len(records) > 256:
        raise TransferError("malformed tensor list")
    incoming = Incoming(tensors=[])
    payloads = list(payloads)
    try:
        for record in records:
            shape, dtype, nbytes = _check_record(record)
            kind = record.get("kind")
            if kind == "ipc":
                if device.type != "cuda":
                    raise TransferError("a CUDA IPC handle sent to a CPU evaluation")
                try:
                    handle = base64.b64decode(str(record.get("handle")), validate=True)
                except ValueError:
                    raise TransferError("bad IPC handle") from None
                offset = record.get("offset")
                if len(handle) != 64 or not isinstance(offset, int) or offset < 0:
                    raise TransferError("bad IPC handle")
                base = _CudaIpc.open(handle)
                incoming.mapped.append(base)
                raw = torch.as_tensor(_DeviceBytes(base + offset, nbytes), device=device)
            elif kind == "bytes":
                if not payloads:
                    raise TransferError("a tensor's bytes are missing")
                data = payloads.pop(0)
                if len(data) != nbytes:
                    raise TransferError("a tensor's bytes do not match its description")
                raw = torch.frombuffer(bytearray(data), dtype=torch.uint8) if nbytes else \
                    torch.empty(0, dtype=torch.uint8)
                raw = raw.to(device)
            else:
                raise TransferError(f"unknown transfer kind {str(kind)[:20]!r}")
            tensor = raw.view(dtype).reshape(shape) if nbytes else torch.empty(shape, dtype=dtype, device=device)
            incoming.tensors.append({"tensor": tensor, "shape": tuple(shape), "dtype": record["dtype"],
                                     "device": str(record.get("device"))})
    except BaseException:
        incoming.close()
        raise
    return incoming
