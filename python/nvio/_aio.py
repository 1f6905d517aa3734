"""DeepSpeed-compatible ``aio_handle``: DeepSpeed's names, argument names, defaults and returns.

Differences from DeepSpeed (each is a case where DeepSpeed returns -1, prints, asserts or aborts):
a missing or short file, a bad argument or an I/O error raises a Python exception naming the path,
offset and length; sizes need not be divisible by ``intra_op_parallelism``; ``wait()`` with
nothing pending returns 0; destroying a handle with I/O pending waits for it; ``read``/``write``
return 1 (the count of completed operations, as DeepSpeed documents) where DeepSpeed returns 0.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Tuple

from . import _args, _buffers, _fork, _nvio
from ._future import Count, Future, PendingFutures

# DeepSpeed's own alignment constant, kept for callers that pad sizes with get_alignment().
_DEEPSPEED_ALIGNMENT = 512

_IO_PARAMS = ("buffer", "filename", "validate", "async", "file_offset")
_SYNC_PARAMS = ("buffer", "filename", "file_offset")


class ValidationError(_nvio.Error, ValueError):
    """``validate=True`` found the buffer and the file differ."""


def _bind(method: str, names: Tuple[str, ...], args: tuple, kwargs: dict, defaults: dict) -> dict:
    """Binds DeepSpeed-style arguments (``async`` is a keyword, so no plain signature can hold it;
    ``fd=`` may replace ``filename=``)."""
    if "fd" in kwargs:
        if "filename" in kwargs:
            raise TypeError(f"{method}() takes filename or fd, not both")
        kwargs = dict(kwargs)
        kwargs["filename"] = kwargs.pop("fd")
    if len(args) > len(names):
        raise TypeError(f"{method}() takes at most {len(names)} arguments ({len(args)} given)")
    bound = dict(zip(names, args))
    for key, value in kwargs.items():
        if key not in names:
            raise TypeError(f"{method}() got an unexpected keyword argument '{key}'")
        if key in bound:
            raise TypeError(f"{method}() got multiple values for argument '{key}'")
        bound[key] = value
    for key in names:
        if key not in bound:
            if key not in defaults:
                raise TypeError(f"{method}() missing required argument '{key}'")
            bound[key] = defaults[key]
    return bound


def _file_bytes(target: Any, offset: int, nbytes: int) -> bytes:
    # A caller's descriptor may be O_DIRECT or write-only: read through a fresh buffered one.
    path = f"/proc/self/fd/{target}" if isinstance(target, int) else target
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(nbytes)


def _buffer_bytes(ref: _buffers.BufferRef) -> bytes:
    if ref.device:
        # Device memory cannot be read from the host directly: copy it through torch.
        owner = _buffers.source(ref)
        if type(owner).__module__.startswith("torch"):
            return owner.detach().reshape(-1).view(-1).cpu().numpy().view("uint8").tobytes()
        raise _nvio.InvalidArgument(
            "nvio: validate=True needs a torch tensor for device memory"
        )
    import ctypes

    return ctypes.string_at(ref.address, ref.nbytes)


def _validate(ref: _buffers.BufferRef, target: Any, offset: int, is_read: bool) -> None:
    """``validate=True``: run by the operation's future once the operation has succeeded."""
    expected = _file_bytes(target, offset, ref.nbytes)
    actual = _buffer_bytes(ref)
    if expected != actual:
        where = next((i for i, (a, b) in enumerate(zip(expected, actual)) if a != b),
                     min(len(expected), len(actual)))
        kind = "read" if is_read else "write"
        raise ValidationError(
            f"nvio: validate after {kind} of {ref.nbytes} bytes at offset {offset} of "
            f"{target!r}: buffer and file differ first at byte {where}"
        )


def deepspeed_is_pinned(buffer: Any) -> bool:
    """DeepSpeed's question (its handles answer "torch pinned it, or my allocator made it"):
    True for memory from ``new_cpu_locked_tensor`` / ``nvio.empty_locked`` and its contiguous
    views, also when RLIMIT_MEMLOCK refused the lock (the handles move that memory the same way;
    DeepSpeed asserts on this answer before swapping), and for locked or torch-pinned memory.
    ``nvio.is_pinned`` answers only whether the memory is locked."""
    from . import is_pinned

    if is_pinned(buffer):
        return True
    try:
        ref = _buffers.resolve(buffer, writable=False)
    except (TypeError, ValueError):
        return False
    return ref.nbytes > 0 and not ref.device and _nvio.in_locked_memory(ref.address, ref.nbytes)


class aio_handle:  # noqa: N801 - DeepSpeed's name
    """Drop-in for DeepSpeed's ``async_io.aio_handle`` (see module docstring for differences).

    Shared by threads: ``wait()`` returns only once every operation queued before it, by any
    thread, has completed, including those another thread's ``wait()`` is collecting; each
    operation is counted by the one wait that collected it, and a wait raises the first failure
    among all the operations it waited for. A forked child may use its parent's handle; the
    parent's queued operations are not the child's (its ``wait()`` does not count them).
    """

    _GPU_DIRECT = "off"  # aio_handle moves CUDA tensors through the host bounce path

    def __init__(
        self,
        block_size: int = 1048576,
        queue_depth: int = 128,
        single_submit: bool = False,
        overlap_events: bool = False,
        intra_op_parallelism: int = 1,
    ) -> None:
        self._block_size = _args.integer(block_size, "block_size")
        self._queue_depth = _args.integer(queue_depth, "queue_depth")
        self._single_submit = _args.boolean(single_submit, "single_submit")
        self._overlap_events = _args.boolean(overlap_events, "overlap_events")
        self._intra_op_parallelism = _args.integer(intra_op_parallelism, "intra_op_parallelism")
        self._core = _nvio.Handle(
            block_size=self._block_size,
            queue_depth=self._queue_depth,
            single_submit=self._single_submit,
            overlap_events=self._overlap_events,
            intra_op_parallelism=self._intra_op_parallelism,
            gpu_direct=self._GPU_DIRECT,
        )
        self._lock = threading.Lock()  # guards the tables of locked and pinned tensors
        self._pending = PendingFutures()  # queued operations, until wait() has seen them finish
        self._locked: "dict[int, Any]" = {}
        _fork.track(self)

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()

    # -- settings ------------------------------------------------------------------------------
    def get_block_size(self) -> int:
        return self._block_size

    def get_queue_depth(self) -> int:
        return self._queue_depth

    def get_single_submit(self) -> bool:
        return self._single_submit

    def get_overlap_events(self) -> bool:
        return self._overlap_events

    def get_intra_op_parallelism(self) -> int:
        return self._intra_op_parallelism

    def get_alignment(self) -> int:
        """DeepSpeed's value (intra_op_parallelism x 512); nvio itself accepts any size."""
        return self._intra_op_parallelism * _DEEPSPEED_ALIGNMENT

    # -- I/O -----------------------------------------------------------------------------------
    def _io(self, is_read: bool, buffer: Any, file: Any, validate: bool, is_async: bool,
            file_offset: int) -> int:
        ref = _buffers.resolve(buffer, writable=is_read)
        # Checked unless already a bool (the per-operation path of small reads; the helpers
        # pass bools).
        if type(validate) is not bool:
            validate = _args.boolean(validate, "validate")
        if type(is_async) is not bool:
            is_async = _args.boolean(is_async, "async")
        check = None
        if validate:  # the check reads the file again: it needs the file and offset checked here
            file = _args.file_target(file, "filename")
            file_offset = _args.offset(file_offset, "file_offset")
            check = functools.partial(_validate, ref, file, file_offset, is_read)
        # Otherwise the binding converts them (check_file/check_offset, under these names).
        if not is_async:
            # A blocking call is one core call that submits and waits: a Ctrl-C cancels what has
            # not started and waits for what the kernel holds before it raises. (Submitting, then
            # waiting in a second call, left Python code between the two: a KeyboardInterrupt
            # raised there left the operation writing into the buffer after the call had raised.)
            if is_read:
                self._core.read(ref.address, ref.nbytes, file, file_offset, ref.device,
                                "filename", "file_offset")
            else:
                self._core.write(ref.address, ref.nbytes, file, file_offset, False, False,
                                 ref.device, "filename", "file_offset")
            if check is not None:
                check()
            return 1
        # The submit hands the ticket to the future and queues it (nvio/_future.py).
        future = Future(self._core, ref.nbytes, ref.owner, self._pending, check)
        if is_read:
            self._core.submit_read(future, ref.address, ref.nbytes, file, file_offset,
                                   ref.device, "filename", "file_offset")
        else:
            self._core.submit_write(future, ref.address, ref.nbytes, file, file_offset, False,
                                    False, ref.device, "filename", "file_offset")
        return 0

    def read(self, buffer: Any, filename: Any, validate: bool, file_offset: int = 0) -> int:
        """Blocking read of ``buffer.nbytes`` from ``filename`` at ``file_offset``; returns 1."""
        return self._io(True, buffer, filename, validate, False, file_offset)

    def write(self, buffer: Any, filename: Any, validate: bool, file_offset: int = 0) -> int:
        """Blocking write of ``buffer`` to ``filename`` at ``file_offset``; returns 1."""
        return self._io(False, buffer, filename, validate, False, file_offset)

    def pread(self, *args: Any, **kwargs: Any) -> int:
        """pread(buffer, filename|fd, validate, async, file_offset=0): 1 if blocking, 0 if queued."""
        b = _bind("pread", _IO_PARAMS, args, kwargs, {"file_offset": 0})
        return self._io(True, b["buffer"], b["filename"], b["validate"], b["async"],
                        b["file_offset"])

    def pwrite(self, *args: Any, **kwargs: Any) -> int:
        """pwrite(buffer, filename|fd, validate, async, file_offset=0): 1 if blocking, 0 if queued."""
        b = _bind("pwrite", _IO_PARAMS, args, kwargs, {"file_offset": 0})
        return self._io(False, b["buffer"], b["filename"], b["validate"], b["async"],
                        b["file_offset"])

    def _simple(self, name: str, is_read: bool, is_async: bool, args: tuple, kwargs: dict) -> int:
        if not kwargs and 2 <= len(args) <= 3:  # (buffer, filename[, file_offset]): no binding
            return self._io(is_read, args[0], args[1], False, is_async,
                            args[2] if len(args) == 3 else 0)
        b = _bind(name, _SYNC_PARAMS, args, kwargs, {"file_offset": 0})
        return self._io(is_read, b["buffer"], b["filename"], False, is_async, b["file_offset"])

    def sync_pread(self, *args: Any, **kwargs: Any) -> int:
        """sync_pread(buffer, filename|fd, file_offset=0): blocking; returns 1."""
        return self._simple("sync_pread", True, False, args, kwargs)

    def sync_pwrite(self, *args: Any, **kwargs: Any) -> int:
        """sync_pwrite(buffer, filename|fd, file_offset=0): blocking; returns 1."""
        return self._simple("sync_pwrite", False, False, args, kwargs)

    def async_pread(self, *args: Any, **kwargs: Any) -> int:
        """async_pread(buffer, filename|fd, file_offset=0): queues; returns 0; see wait()."""
        return self._simple("async_pread", True, True, args, kwargs)

    def async_pwrite(self, *args: Any, **kwargs: Any) -> int:
        """async_pwrite(buffer, filename|fd, file_offset=0): queues; returns 0; see wait()."""
        return self._simple("async_pwrite", False, True, args, kwargs)

    def wait(self) -> int:
        """Waits for every operation queued before this call, by any thread, including those
        another thread's wait() is collecting; returns how many this wait collected (0 when none).
        All are waited for; the first failure among them is then raised."""
        return self._pending.wait_all(Count.COLLECTED)

    def stats(self) -> "dict[str, Any]":
        """nvio's counters of this handle (not in DeepSpeed): as ``nvio.Handle.stats()``."""
        return self._core.stats()

    # -- locked memory -------------------------------------------------------------------------
    def new_cpu_locked_tensor(self, num_elem: int, example_tensor: Any = None, **kwargs: Any):
        """A page-aligned, locked CPU tensor of ``num_elem`` elements of the example's dtype.
        DeepSpeed's misspelled keyword ``example_tenosr`` is accepted too."""
        if "example_tenosr" in kwargs:
            example_tensor = kwargs.pop("example_tenosr")
        if kwargs:
            raise TypeError(f"new_cpu_locked_tensor() got unexpected arguments {sorted(kwargs)}")
        if example_tensor is None:
            raise TypeError("new_cpu_locked_tensor() missing required argument 'example_tensor'")
        from . import empty_locked

        # Not int(num_elem): 2.7 would silently become 2 elements, "3" three.
        tensor = empty_locked(_args.integer(num_elem, "num_elem"), dtype=example_tensor.dtype)
        with self._lock:
            self._locked[tensor.data_ptr()] = tensor
        return tensor

    def free_cpu_locked_tensor(self, tensor: Any) -> bool:
        """Forgets a tensor made by new_cpu_locked_tensor (its memory goes with its last
        reference). Returns False for a tensor this handle did not make."""
        with self._lock:
            return self._locked.pop(tensor.data_ptr(), None) is not None

    def is_pinned(self, tensor: Any) -> bool:
        """DeepSpeed's question; see ``deepspeed_is_pinned``."""
        return deepspeed_is_pinned(tensor)

    def __del__(self) -> None:
        # Never leave I/O running into buffers that are about to be freed.
        pending = getattr(self, "_pending", None)
        if pending:
            pending.drain()


def aio_read(buffer: Any, filename: Any, block_size: int, queue_depth: int, single_submit: bool,
             overlap_events: bool, validate: bool) -> int:
    """DeepSpeed's module-level read of ``buffer.nbytes`` from the start of ``filename``; 0 on
    success (DeepSpeed's value), an exception otherwise."""
    aio_handle(block_size, queue_depth, single_submit, overlap_events).read(buffer, filename,
                                                                             validate)
    return 0


def aio_write(buffer: Any, filename: Any, block_size: int, queue_depth: int, single_submit: bool,
              overlap_events: bool, validate: bool) -> int:
    """DeepSpeed's module-level write of ``buffer`` to the start of ``filename``; 0 on success."""
    aio_handle(block_size, queue_depth, single_submit, overlap_events).write(buffer, filename,
                                                                              validate)
    return 0


# ---- gds_handle ---------------------------------------------------------------------


class gds_handle(aio_handle):  # noqa: N801 - DeepSpeed's name
    """Drop-in for DeepSpeed's ``gds_handle``: the ``aio_handle`` API plus pinned device tensors.

    CUDA tensors move through cuFile (GPUDirect Storage) when it is usable here, in real
    peer-to-peer or in cuFile's compatibility mode; otherwise through nvio's pipelined host
    bounce path, which is said once (a RuntimeWarning) instead of failing. Host tensors take the
    host path. Every cuFile or CUDA error raises ``nvio.GpuError`` naming the call, the error and
    the file; DeepSpeed's ``gds_handle`` calls ``exit()``.
    """

    _GPU_DIRECT = "on"

    def __init__(
        self,
        block_size: int = 1048576,
        queue_depth: int = 128,
        single_submit: bool = False,
        overlap_events: bool = False,
        intra_op_parallelism: int = 1,
    ) -> None:
        super().__init__(block_size, queue_depth, single_submit, overlap_events,
                         intra_op_parallelism)
        self._pinned: "dict[int, Any]" = {}

    @staticmethod
    def _device_ref(tensor: Any) -> _buffers.BufferRef:
        ref = _buffers.resolve(tensor, writable=False)
        if not ref.device:
            raise _nvio.InvalidArgument(
                "nvio: gds_handle pins CUDA tensors only; use new_cpu_locked_tensor for host memory"
            )
        return ref

    def new_pinned_device_tensor(self, num_elem: int, example_tensor: Any, **kwargs: Any):
        """An uninitialised CUDA tensor of ``num_elem`` elements of the example's dtype, on its
        device, registered with cuFile. DeepSpeed's misspelled ``example_tenosr`` is accepted."""
        if "example_tenosr" in kwargs:
            example_tensor = kwargs.pop("example_tenosr")
        if kwargs:
            raise TypeError(f"new_pinned_device_tensor() got unexpected arguments {sorted(kwargs)}")
        import torch

        if not (isinstance(example_tensor, torch.Tensor) and example_tensor.is_cuda):
            raise _nvio.InvalidArgument(
                "nvio: new_pinned_device_tensor needs a CUDA example tensor (its device and dtype)"
            )
        if int(num_elem) < 1:
            raise _nvio.InvalidArgument(f"nvio: num_elem must be at least 1, got {num_elem}")
        tensor = torch.empty(int(num_elem), dtype=example_tensor.dtype,
                             device=example_tensor.device)
        self.pin_device_tensor(tensor)
        return tensor

    def free_pinned_device_tensor(self, tensor: Any) -> bool:
        """Deregisters a tensor made by new_pinned_device_tensor; False if this handle did not
        make or pin it."""
        return self.unpin_device_tensor(tensor)

    def pin_device_tensor(self, tensor: Any) -> bool:
        """Registers a CUDA tensor's memory with cuFile (views of it then use the registration).
        Returns False when cuFile is not usable here (nothing to register: the bounce path needs
        no registration)."""
        ref = self._device_ref(tensor)
        with self._lock:
            if ref.address in self._pinned:
                return True
        registered = _nvio.gds_register(ref.address, ref.nbytes)
        with self._lock:
            self._pinned[ref.address] = (tensor, registered)
        return registered

    def unpin_device_tensor(self, tensor: Any) -> bool:
        """Undoes pin_device_tensor. Returns False for a tensor this handle did not pin."""
        ref = self._device_ref(tensor)
        with self._lock:
            entry = self._pinned.pop(ref.address, None)
        if entry is None:
            return False
        if entry[1]:
            _nvio.gds_deregister(ref.address)
        return True

    def __del__(self) -> None:
        super().__del__()
        for address, (_, registered) in list(getattr(self, "_pinned", {}).items()):
            if registered:
                try:
                    _nvio.gds_deregister(address)
                except BaseException:
                    pass
