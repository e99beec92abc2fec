"""The mount side of a job's jail (namespaces.py enters it): the libc handle, mount(2) and
mount_setattr(2), read-only remounts, and hiding directories under an empty tmpfs.

Hiding races the host: another process may remove a directory to hide (or make it again)
while a job's jail is made. A directory removed before its tmpfs is mounted is nothing to hide;
one removed after it detaches that tmpfs in our namespace too (rmdir of another mount
namespace's mount point succeeds since Linux 3.18), so sealing it read-only fails with ENOENT or
EINVAL: gone, nothing is left to hide; made again, it is hidden again (`hide_all`, `seal`).
A top-level directory the host makes after the jail is made is beyond this module: the job is
then already running (docs/concepts/isolation.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import stat
from pathlib import Path

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 0x400, 0x800, 0x200000, 0x1000000

MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
# The syscalls numbered from 424 up are the same on every architecture but alpha; we only
# claim the two we can reason about.
SYS_MOUNT_SETATTR = {"x86_64": 442, "aarch64": 442}.get(platform.machine())

# Tests set this to exercise the path taken on kernels older than 5.12 (no mount_setattr).
FORCE_REMOUNT_FALLBACK = False

PRIVATE_TMP_BYTES = 1 << 30  # a private /tmp (enter_job_jail(private_tmp=True)): ncu's own files
HIDE_TRIES = 16  # a directory the host removes and makes again while we hide it (3 lost 1 jail in
# about 250 of tests/jail_churn.py on a loaded 2-core CI machine, whose churn never pauses)


class JailError(RuntimeError):
    """A step of the jail failed in "namespaces" mode. The server turns this into a harness
    error for the job: it never runs a candidate with less isolation than it reports."""


libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
libc.syscall.restype = ctypes.c_long


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

def check_errno(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        exc = JailError(f"{what}: {os.strerror(err)} ({errno.errorcode.get(err, err)})")
        exc.errno = err
        raise exc
    return ret


def _b(path: str | Path | None) -> bytes | None:
    return None if path is None else os.fsencode(str(path))


def mount(source: str | None, target: str | Path, fstype: str | None, flags: int, data: str | None = None) -> None:
    check_errno(libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)),
           f"mount({source!r}, {str(target)!r}, {fstype!r}, {flags:#x})")

def is_under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents

# -- mounts -------------------------------------------------------------------------------------

def mount_setattr(path: str | Path, attr_set: int, attr_clr: int, recursive: bool) -> bool:
    """mount_setattr(2): False when the kernel lacks it (ENOSYS) or the arch is unknown."""
    if SYS_MOUNT_SETATTR is None:
        return False
    attr = _MountAttr(attr_set, attr_clr, 0, 0)
    ret = libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, _b(path), AT_RECURSIVE if recursive else 0,
                        ctypes.byref(attr), ctypes.sizeof(attr))
    if ret < 0:
        if ctypes.get_errno() == errno.ENOSYS:
            return False
        check_errno(ret, f"mount_setattr({str(path)!r})")
    return True


def _kept_flags(path: str) -> int:
    """The per-mount flags a bind remount must repeat. In a user namespace the flags that came
    from the parent namespace are locked, and a remount that would clear one fails (EPERM)."""
    st = os.statvfs(path)
    flags = 0
    for st_flag, ms_flag in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                             (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
                             (os.ST_RELATIME, MS_RELATIME)):
        if st.f_flag & st_flag:
            flags |= ms_flag
    return flags


def _unescape_mountinfo(field: str) -> str:
    return field.encode().decode("unicode_escape").encode("latin-1").decode(errors="surrogateescape")


def _remount_all_readonly() -> None:
    """Fallback without mount_setattr: remount every mount of our namespace read-only, one by
    one, from /proc/self/mountinfo (a bind+remount of / alone would leave submounts such as
    /tmp or /dev/shm writable). Overmounted mount points cannot be reached by path: they are
    hidden, and the mounts that hide them are remounted too."""
    with open("/proc/self/mountinfo") as fh:
        targets = [_unescape_mountinfo(line.split()[4]) for line in fh]
    for target in targets:
        try:
            mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _kept_flags(target))
        except FileNotFoundError:
            continue  # statvfs: the mount point is gone (a mount on a since deleted path)
        except JailError as exc:
            if _errno_in(exc, errno.ENOENT):
                continue
            raise


def set_readonly(path: str | Path, readonly: bool, recursive: bool, nosuid_nodev: bool = False) -> str:
    """Make one mount (or the tree under it) read-only, or writable again; optionally also
    nosuid+nodev. Other flags (noexec, atime) stay as they are. Returns the method used."""
    extra = (MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV) if nosuid_nodev else 0
    if not FORCE_REMOUNT_FALLBACK and mount_setattr(path, (MOUNT_ATTR_RDONLY if readonly else 0) | extra,
                                                     0 if readonly else MOUNT_ATTR_RDONLY, recursive):
        return "mount_setattr"
    if recursive:
        if not readonly or extra:
            raise JailError("only a recursive read-only remount is supported without mount_setattr")
        _remount_all_readonly()
        return "remount"
    flags = _kept_flags(str(path)) | (MS_RDONLY if readonly else 0) | (MS_NOSUID | MS_NODEV if extra else 0)
    mount(None, path, None, MS_REMOUNT | MS_BIND | flags)
    return "remount"

# -- hiding ---------------------------------------------------------------------------------------

def _errno_in(exc: BaseException, *codes: int) -> bool:
    """The failed call's errno is one of `codes` (a JailError carries it as an OSError does): the
    one test by which a mount call that raced the host is told from a real failure."""
    return getattr(exc, "errno", None) in codes


def _hide_one(h: Path, as_private_tmp: bool, listed: bool = False) -> bool:
    """Cover the directory `h` with an empty tmpfs (a private /tmp: a writable one); False where
    it vanished meanwhile (another process removed it after the hide list was made, or after the
    look above: a directory the host removes while a job starts is nothing to hide). `listed`:
    `h` is a top-level directory the jail listed itself (jail.hidden_tops), not one a caller
    named: one that is no longer a directory is skipped as every top-level file is, where a
    named one that is not a directory fails the jail (what it holds would be in view)."""
    for _ in range(HIDE_TRIES):
        try:
            is_dir = stat.S_ISDIR(os.stat(h).st_mode)  # one look: is_dir() then lexists() races the host
        except FileNotFoundError:
            if not os.path.lexists(h):
                return False
            if os.path.islink(h) and not os.path.exists(h):
                is_dir = False  # a dangling link
            else:
                continue  # made again since the look: look again
        if not is_dir:
            if listed:
                return False
            raise JailError(f"hide path {h} is not a directory (hide the directory that holds it)")
        try:
            if as_private_tmp:
                mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV, f"size={PRIVATE_TMP_BYTES},mode=1777")
            else:
                mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=1m,mode=0755")
            return True
        except (OSError, JailError) as exc:
            if not _errno_in(exc, errno.ENOENT):
                raise
            if not os.path.lexists(h):
                return False  # removed between the look and the mount
    raise JailError(f"hide path {h} was removed and made again {HIDE_TRIES} times while it was hidden")


def hide_all(hides: list[Path], private_tmp: Path | None, listed: frozenset[Path] = frozenset()) -> list[Path]:
    """Cover each directory of `hides` (shortest paths first) with an empty tmpfs, writable
    until `seal`; one under an already hidden directory is gone with it. `listed`: those of
    `hides` the jail listed itself (`_hide_one`). Returns what was hidden."""
    hidden: list[Path] = []
    for h in hides:
        if any(is_under(h, done) for done in hidden) or not os.path.lexists(h):
            continue  # hidden with a parent already, or nothing there to hide
        if _hide_one(h, h == private_tmp, h in listed):
            hidden.append(h)
    return hidden


def seal(hidden: list[Path], private_tmp: Path | None, held: list[Path]) -> list[Path]:
    """Turn each hiding tmpfs read-only (a private /tmp stays writable), after the paths in
    `held` were bound back. A hidden directory the host removed meanwhile took our tmpfs with it
    (ENOENT or EINVAL here): gone, it is dropped from the list; made again, it is hidden and
    sealed again, unless a held path lies under it (that bind went with the tmpfs: the jail
    fails). Returns what stays hidden."""
    sealed: list[Path] = []
    for h in hidden:
        if h == private_tmp:
            sealed.append(h)
            continue
        for _ in range(HIDE_TRIES):
            try:
                mount(None, h, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
                sealed.append(h)
                break
            except (OSError, JailError) as exc:
                if not _errno_in(exc, errno.ENOENT, errno.EINVAL):  # the host removed h, or our mount on it
                    raise
                if any(is_under(p, h) for p in held):
                    raise JailError(f"hidden directory {h} was removed while the jail was made, "
                                    "with a directory bound back under it") from None
                if not _hide_one(h, False):
                    break  # removed: nothing left to hide
        else:
            raise JailError(f"hidden directory {h} was removed and made again {HIDE_TRIES} times "
                            "while the jail was made")
    return sealed
