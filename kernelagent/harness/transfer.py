"""Moving tensors from the candidate's process to the trusted reference process.

Only plain, dense `torch.Tensor` objects cross: subclasses, lazy wrappers and anything
else are refused before packing, and what arrives is rebuilt from raw memory, so no
candidate object ever runs code in the trusted process.

Two ways across:
- "ipc": CUDA tensors through CUDA IPC handles (no copy; the sender keeps them alive until
  the receiver has answered).
- "shm": a copy through a POSIX shared-memory segment (CPU mode, or when IPC fails).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import torch


class OutputTypeError(Exception):
    """The candidate returned something that is not a plain dense tensor (or tuple of them)."""


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
class Packed:
    """A picklable description of tensors in flight; `keepalive` stays with the sender."""

    payload: bytes
    keepalive: list[Any]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def pack(tensors: list[torch.Tensor], use_ipc: bool) -> Packed:
    """Describe `tensors` for `unpack` in another process."""
    records: list[dict[str, Any]] = []
    keepalive: list[Any] = []
    for tensor in tensors:
        meta = {"shape": tuple(tensor.shape), "dtype": _dtype_name(tensor.dtype),
                "device": tensor.device.type}
        if use_ipc and tensor.is_cuda:
            from torch.multiprocessing.reductions import reduce_tensor

            # A contiguous copy of our own, so the receiver sees exactly what we checked.
            owned = tensor.detach().contiguous().clone()
            rebuild, args = reduce_tensor(owned)
            keepalive.append(owned)
            records.append({**meta, "kind": "ipc", "rebuild": rebuild, "args": args})
        else:
            host = tensor.detach().to("cpu").contiguous()
            nbytes = host.numel() * host.element_size()
            segment = shared_memory.SharedMemory(create=True, size=max(nbytes, 1))
            if nbytes:
                view = torch.frombuffer(segment.buf, dtype=torch.uint8, count=nbytes)
                view.copy_(host.reshape(-1).view(torch.uint8))
                del view
            keepalive.append(segment)
            records.append({**meta, "kind": "shm", "name": segment.name, "nbytes": nbytes})
    return Packed(payload=pickle.dumps(records), keepalive=keepalive)


def release(packed: Packed) -> None:
    for item in packed.keepalive:
        if isinstance(item, shared_memory.SharedMemory):
            item.close()
            try:
                item.unlink()
            except FileNotFoundError:
                pass
    packed.keepalive.clear()


def unpack(payload: bytes, device: torch.device) -> list[dict[str, Any]]:
    """Rebuild tensors described by `payload` as tensors owned by this process.

    Returns records {"tensor", "shape", "dtype", "device"} where "device" is the device
    type the sender reported. IPC tensors are cloned at once so that the sender's memory
    can be let go.
    """
    # The payload comes from the candidate's process: only our own record format is
    # accepted, and only torch's own rebuild function may be called.
    records = _safe_loads(payload)
    out = []
    for record in records:
        dtype = getattr(torch, record["dtype"])
        if record["kind"] == "ipc":
            from torch.multiprocessing.reductions import rebuild_cuda_tensor

            if record["rebuild"] is not rebuild_cuda_tensor:
                raise ValueError("unexpected rebuild function in IPC payload")
            shared = rebuild_cuda_tensor(*record["args"])
            tensor = shared.clone()
            del shared
        else:
            segment = shared_memory.SharedMemory(name=record["name"])
            try:
                count = record["nbytes"]
                raw = torch.frombuffer(segment.buf, dtype=torch.uint8, count=count) if count else \
                    torch.empty(0, dtype=torch.uint8)
                tensor = raw.clone().view(dtype).reshape(record["shape"]).to(device)
                del raw
            finally:
                segment.close()
        if tuple(tensor.shape) != tuple(record["shape"]) or tensor.dtype != dtype:
            raise ValueError("payload metadata does not match its tensor")
        out.append({"tensor": tensor, "shape": tuple(record["shape"]), "dtype": record["dtype"],
                    "device": record["device"]})
    return out


class _RestrictedUnpickler(pickle.Unpickler):
    """Allows only the globals our records can contain."""

    ALLOWED = {
        ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"),
        ("torch", "Tensor"),
        ("torch", "UntypedStorage"),
        ("torch.storage", "UntypedStorage"),
        ("torch", "TypedStorage"),
        ("torch.storage", "TypedStorage"),
        ("torch", "device"),
        ("torch", "Size"),
    }
    DTYPES = {name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED or (module == "torch" and name in self.DTYPES):
            return super().find_class(module, name)
        if module == "builtins" and name in ("tuple", "list", "dict", "int", "float", "bool", "bytes"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused global {module}.{name} in candidate payload")


def _safe_loads(payload: bytes) -> list[dict[str, Any]]:
    import io

    records = _RestrictedUnpickler(io.BytesIO(payload)).load()
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError("malformed payload from the candidate process")
    return records
