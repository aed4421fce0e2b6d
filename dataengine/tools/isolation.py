"""Linux isolation primitives for sandbox workers (ctypes over libc; no root-only assumptions).

What a worker builds from them (see dataengine.tools.worker):
- new user, mount, network, IPC and PID namespaces (`unshare`); the user namespace gives the
  worker capabilities over the others only, none on the host, whether it runs as root or not;
- a private root file system (`build_view`): a tmpfs holding read-only bind mounts of the
  folders Python and the tools need, a size-limited tmpfs for /tmp (the scratch folder) and
  /dev/shm, a few device nodes, and a fresh /proc of the PID namespace (`finish_view`);
- no capabilities left once the view is built (`drop_capabilities`), so a tool cannot undo
  the mounts.
Every function raises OSError with the step that failed; callers fall back when one does.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
MOUNT_ATTR_RDONLY = 1
AT_FDCWD, AT_RECURSIVE = -100, 0x8000

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
PR_SET_CHILD_SUBREAPER = 36

# Syscalls glibc may not wrap (numbers per architecture; mount_setattr is 442 everywhere).
_SYSCALLS = {"x86_64": {"pivot_root": 155, "mount_setattr": 442},
             "aarch64": {"pivot_root": 41, "mount_setattr": 442}}

# /etc entries the dynamic loader and the standard library read; the rest of /etc is hidden.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "mime.types",
             "ssl", "ca-certificates", "alternatives", "nsswitch.conf", "host.conf")
DEVICES = ("null", "zero", "full", "random", "urandom")
SYSTEM_DIRS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/opt/conda")

_libc: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        _libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        _libc.syscall.restype = ctypes.c_long
        _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return _libc


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _syscall(name: str, *args: object) -> int:
    lib = libc()
    if hasattr(lib, name):
        return getattr(lib, name)(*args)
    number = _SYSCALLS.get(platform.machine(), {}).get(name)
    if number is None:
        ctypes.set_errno(errno.ENOSYS)
        return -1
    return lib.syscall(number, *args)


def prctl(option: int, arg: int = 0) -> None:
    _check(libc().prctl(option, arg, 0, 0, 0), f"prctl({option})")


def unshare(flags: int) -> None:
    _check(libc().unshare(flags), "unshare")


def map_ids(uid: int, gid: int, inside: int = 1000) -> None:
    """After unshare(CLONE_NEWUSER): map `inside` to the uid and gid this process had before
    (one id each; allowed without privileges). A non-zero id inside means exec'd programs get
    no capabilities."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{inside} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{inside} {gid} 1")


def _bytes(text: str | None) -> bytes | None:
    return text.encode() if text is not None else None


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(libc().mount(_bytes(source), _bytes(target), _bytes(fstype), flags, _bytes(data)), f"mount {target}")


def umount(target: str) -> None:
    _check(libc().umount2(target.encode(), MNT_DETACH), f"umount {target}")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def make_read_only(target: str, recursive: bool = True) -> None:
    """Make a mount (and, with mount_setattr, every mount below it) read-only."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    if _syscall("mount_setattr", AT_FDCWD, target.encode(), flags, ctypes.byref(attr),
                ctypes.c_size_t(ctypes.sizeof(attr))) == 0:
        return
    # Kernels before 5.12: remount this mount only, keeping the flags the kernel locks.
    st = os.statvfs(target)
    kept = {os.ST_NOSUID: MS_NOSUID, os.ST_NODEV: MS_NODEV, os.ST_NOEXEC: MS_NOEXEC,
            os.ST_NOATIME: 1024, os.ST_NODIRATIME: 2048, os.ST_RELATIME: 1 << 21}
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    for bit, ms in kept.items():
        if st.f_flag & bit:
            flags |= ms
    mount(None, target, None, flags)


def _make_mount_point(target: str, like: str) -> None:
    if os.path.isdir(like):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.lexists(target):
            open(target, "w").close()


def _bind(source: str, target: str, read_only: bool = True) -> None:
    _make_mount_point(target, source)
    mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        make_read_only(target)


# Writable in the view (one scratch tmpfs); read-only paths may sit below them, never replace them.
SCRATCH_TARGETS = ("/tmp", "/dev/shm")


def view_paths(extra: tuple[str, ...] | list[str]) -> list[str]:
    """Absolute, existing, real folders/files to show read-only, without ones inside others."""
    paths = {os.path.realpath(p) for p in [*SYSTEM_DIRS, *extra] if p and os.path.exists(p)}
    kept: list[str] = []
    for p in sorted(paths, key=len):
        if p != "/" and not any(p == k or p.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(p)
    return kept


def build_view(root: str, read_paths: list[str], scratch_mb: int) -> None:
    """Make `root` (an empty folder) this mount namespace's root file system; the old root is
    left at /.old until `finish_view` (called from inside the new PID namespace) detaches it.

    Layout: read_paths (real paths) and the top-level symlinks of / (e.g. /lib -> usr/lib)
    read-only; /etc: ETC_FILES only; /dev: DEVICES, fd and std* links, /dev/shm; /tmp and
    /dev/shm share one tmpfs of scratch_mb MiB; /proc empty until finish_view.
    """
    root = os.path.realpath(root)
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=755")
    for name in os.listdir("/"):
        if os.path.islink("/" + name):
            os.symlink(os.readlink("/" + name), f"{root}/{name}")
    # The scratch tmpfs first, the read-only paths after: code that lives under /tmp (a clone,
    # a venv) stays visible on top of the writable /tmp instead of being hidden by it.
    scratch = root + "/.scratch"
    os.makedirs(scratch)
    mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, f"size={scratch_mb}m,mode=755")
    for sub, target in (("tmp", "/tmp"), ("shm", "/dev/shm")):
        os.mkdir(f"{scratch}/{sub}")
        os.chmod(f"{scratch}/{sub}", 0o1777)
        os.makedirs(root + target, exist_ok=True)
        mount(f"{scratch}/{sub}", root + target, None, MS_BIND)
    umount(scratch)
    for path in read_paths:
        if path in SCRATCH_TARGETS:
            continue  # /tmp itself on sys.path: the writable scratch wins
        if os.path.realpath(os.path.dirname(root + path)).startswith(root):  # not through a symlink
            _bind(path, root + path)
    os.makedirs(root + "/etc", exist_ok=True)
    for name in ETC_FILES:
        path = "/etc/" + name
        if os.path.exists(path) and not os.path.lexists(root + path):
            _bind(path, root + path)
    os.makedirs(root + "/dev", exist_ok=True)
    for name in DEVICES:
        if os.path.exists("/dev/" + name) and stat.S_ISCHR(os.stat("/dev/" + name).st_mode):
            _bind("/dev/" + name, f"{root}/dev/{name}", read_only=False)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    for name in ("proc", ".old"):
        os.makedirs(f"{root}/{name}", exist_ok=True)
    make_read_only(root, recursive=False)
    _check(_syscall("pivot_root", root.encode(), f"{root}/.old".encode()), "pivot_root")
    os.chdir("/")


def host_pid() -> int:
    """This process's pid in the host's PID namespace (read through the old root's /proc)."""
    for path in ("/.old/proc/self/status", "/proc/self/status"):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("NSpid:"):
                        return int(line.split()[1])
        except OSError:
            continue
    return os.getpid()


def finish_view() -> None:
    """In the new PID namespace: mount its own /proc, then detach the old root."""
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    umount("/.old")


def drop_capabilities() -> None:
    """Give up every capability (bounding, ambient, effective, permitted, inheritable) and
    set no_new_privs: nothing this process or its children run can mount, unmount or gain them."""
    lib = libc()
    cap = 0
    while lib.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    lib.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (Data * 2)()
    _check(lib.capset(ctypes.byref(header), data), "capset")
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def effective_capabilities() -> int:
    """CapEff of this process (0 once drop_capabilities ran)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return -1


def process_tree() -> dict[int, list[int]]:
    """parent pid -> child pids of every process this one can see (one pass over /proc)."""
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        ppid = int(data[data.rfind(b")") + 2:].split(None, 2)[1])
        tree.setdefault(ppid, []).append(int(name))
    return tree


def descendants(pid: int, tree: dict[int, list[int]] | None = None) -> list[int]:
    """Every descendant of `pid` (children first), from `tree` or a fresh process_tree()."""
    tree = process_tree() if tree is None else tree
    out: list[int] = []
    stack = list(tree.get(pid, ()))
    while stack:
        child = stack.pop()
        out.append(child)
        stack.extend(tree.get(child, ()))
    return out
