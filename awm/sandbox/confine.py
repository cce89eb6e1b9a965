"""Kernel confinement of a worker process that is about to run untrusted code.

Applied once, in the worker, after its imports and before it reads any untrusted code. Every
layer is enforced by the kernel; nothing depends on the confined Python code behaving:

1. **User, mount, network and IPC namespaces** (``unshare(CLONE_NEWUSER | CLONE_NEWNS |
   CLONE_NEWNET | CLONE_NEWIPC)``): the worker keeps no capability in the host's namespaces (even
   when started as root), sees no network interface and no host semaphore, message queue or
   shared-memory segment. Kubernetes' ``RuntimeDefault`` seccomp profile forbids
   ``unshare``; the other layers do not need it, and the report says it is missing.
   **File view** (``fsview``, in the new mount namespace): the root becomes a read-only tmpfs that
   holds only the given paths, each a read-only bind mount (the same paths Landlock allows). It is
   the file rule where Landlock is missing - gVisor implements namespaces and mounts but not
   Landlock - and a second, independent one where both exist.
2. **rlimits**: address space, CPU seconds, no file writes (``RLIMIT_FSIZE = 0``), no core files,
   a handful of descriptors, no new processes (``RLIMIT_NPROC = 0``).
3. **Landlock** (kernel ≥ 5.13): the filesystem is read-only and limited to the given paths (the
   Python installation); TCP bind/connect are refused (ABI ≥ 4); signals to processes outside the
   worker and abstract unix sockets are refused (ABI ≥ 6).
4. **seccomp** through libseccomp (``pyseccomp`` bindings): no sockets, no ``execve``, no
   ``fork``/``clone`` (so no threads either), no ``ptrace`` or cross-process memory access, no
   signals except to itself, no namespace, mount, BPF, keyring or module calls; resource limits,
   priorities, scheduling and I/O priority of the caller only (``prlimit64``, ``setpriority``,
   ``sched_set*``, ``ioprio_set`` with pid 0), and no asking the kernel to signal a process on
   I/O (``F_SETOWN``, ``F_SETSIG``, ``F_SETOWN_EX``, ``FIOSETOWN``/``SIOCSPGRP``/``TIOCSPGRP``).
   Installed last, with ``no_new_privs``.

:func:`probe` tells, without confining anything, which layers this kernel offers; the env server
reports it at start and in ``/info`` and refuses untrusted code when a required layer is missing
(unless told to accept weaker isolation).

Landlock is called through ``ctypes`` here: its one Python binding on PyPI (``landlock``) is a
development release that handles the filesystem only, not the network and signal scopes.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import resource
import signal
import stat
from dataclasses import dataclass, field

# Layers without which untrusted code is not run (unless the operator accepts weaker isolation):
# seccomp, and a file rule - Landlock or the file view (either keeps the credential, the catalog and
# the project's code out of reach).
REQUIRED = ("seccomp",)
FILE_RULES = ("landlock", "fsview")

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_CLONE_NEWIPC = 0x08000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_NOATIME, _MS_NODIRATIME, _MS_PRIVATE, _MS_REC = 32, 4096, 1024, 2048, 1 << 18, 1 << 14
_MS_RELATIME, _ST_RELATIME = 1 << 21, 4096
_MNT_DETACH = 2
_PR_CAPBSET_DROP = 24
_CAP_VERSION_3 = 0x20080522
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2

_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_FS_READ_FILE, _FS_READ_DIR = 1 << 2, 1 << 3
_NET_BIND_TCP, _NET_CONNECT_TCP = 1, 2
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2

# Syscalls a worker never needs once it runs untrusted code (EPERM, or ENOSYS for clone3 so that
# libc falls back to clone, which is refused too).
DENIED_SYSCALLS = (
    # processes and threads
    "fork", "vfork", "clone", "execve", "execveat",
    # network and IPC outside the inherited pipes
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    # SysV and POSIX IPC, every call (an object made elsewhere is reached by key, id or name):
    # the worker's own IPC namespace hides the host's too
    "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop",
    "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
    "mq_getsetattr",
    # other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "process_madvise", "kcmp",
    # privileges, namespaces, mounts
    "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups",
    "setfsuid", "setfsgid", "capset", "unshare", "setns", "mount", "umount2", "pivot_root",
    "chroot", "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig", "fspick",
    "mount_setattr",
    # kernel facilities
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "init_module", "finit_module",
    "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff",
    "personality", "open_by_handle_at", "name_to_handle_at", "acct", "quotactl",
    "settimeofday", "clock_settime", "adjtimex", "clock_adjtime", "sethostname",
    "setdomainname", "iopl", "ioperm", "lookup_dcookie", "fanotify_init", "syslog",
    "vhangup", "mbind", "migrate_pages", "move_pages", "set_mempolicy",
)


# Syscalls that take a target process (argument index of the pid): only the caller itself.
SELF_ONLY_SYSCALLS = (
    ("prlimit64", 0), ("setpriority", 1), ("sched_setaffinity", 0), ("sched_setscheduler", 0),
    ("sched_setparam", 0), ("sched_setattr", 0), ("ioprio_set", 1), ("sched_getattr", 0),
    ("sched_getaffinity", 0), ("sched_getparam", 0), ("sched_getscheduler", 0),
    ("sched_rr_get_interval", 0), ("getpriority", 1), ("ioprio_get", 1),
    ("get_robust_list", 0),
)
# fcntl: F_SETOWN, F_SETSIG, F_SETOWN_EX; ioctl: FIOSETOWN, SIOCSPGRP, TIOCSPGRP.
FCNTL_SIGNAL_COMMANDS = (8, 10, 15)
IOCTL_SIGNAL_REQUESTS = (0x8901, 0x8902, 0x5410)


def _add(flt: object, action: object, name: str, *args: object) -> None:
    try:
        flt.add_rule(action, name, *args)  # type: ignore[attr-defined]
    except (OSError, ValueError):
        pass  # not a syscall on this architecture


class ConfinementError(RuntimeError):
    """A required layer could not be applied."""


@dataclass
class Report:
    """What was applied, layer by layer (``missing`` names what this kernel or runtime lacks)."""

    applied: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    landlock_abi: int = 0

    @property
    def strong(self) -> bool:
        return (all(layer in self.applied for layer in REQUIRED)
                and any(layer in self.applied for layer in FILE_RULES))

    def as_dict(self) -> dict[str, object]:
        return {"applied": self.applied, "missing": self.missing, "landlock_abi": self.landlock_abi,
                "strong": self.strong}


@dataclass
class Limits:
    memory_mb: int = 512
    cpu_s: int = 3600  # over the worker's whole life; the caller enforces per-call wall time
    open_files: int = 64


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:  # once per process: a fork server's children inherit it
    return ctypes.CDLL(None, use_errno=True)


def _syscall(libc: ctypes.CDLL, number: int, *args: object) -> int:
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is absent or disabled."""
    try:
        return _syscall(_libc(), _SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    except OSError:
        return 0


def seccomp_problem() -> str | None:
    """Why seccomp filters cannot be installed here, or None."""
    try:
        import pyseccomp  # noqa: F401 - loads libseccomp
    except Exception as exc:  # noqa: BLE001 - OSError when libseccomp.so is missing
        return f"libseccomp unavailable: {exc}"
    try:
        with open("/proc/self/status") as status:
            if not any(line.startswith("Seccomp:") for line in status):
                return "kernel without seccomp"
    except OSError:
        pass
    return None


def probe() -> Report:
    """Which required layers this machine offers (nothing is applied)."""
    report = Report(landlock_abi=landlock_abi())
    if report.landlock_abi:
        report.applied.append("landlock")
    else:
        report.missing["landlock"] = "kernel without Landlock (needs Linux >= 5.13 with landlock in lsm=)"
    problem = fsview_problem()
    if problem is None:
        report.applied.append("fsview")
    else:
        report.missing["fsview"] = problem
    problem = seccomp_problem()
    if problem is None:
        report.applied.append("seccomp")
    else:
        report.missing["seccomp"] = problem
    return report


def fsview_problem() -> str | None:
    """Why the file view cannot be built here (no user and mount namespace for this process, as
    under Kubernetes' ``RuntimeDefault`` seccomp profile), or None. Tried in a forked child that
    exits at once: nothing here is changed."""
    pid = os.fork()
    if pid == 0:
        code = 0 if _libc().unshare(_CLONE_NEWUSER | _CLONE_NEWNS) == 0 else min(ctypes.get_errno(), 255) or 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return None if code == 0 else f"no user and mount namespace: {os.strerror(code) if code > 0 else 'killed'}"


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies; exit now if it already has."""
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(0)


def child_subreaper() -> None:
    """Become the parent of this process's orphaned descendants (``PR_SET_CHILD_SUBREAPER``):
    a fork server's workers outlive a killed environment zygote by a moment, and are reaped here
    rather than by whatever runs as pid 1 (an env server, in a pod)."""
    _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def enter_namespaces(report: Report, read_paths: list[str] | None = None) -> None:
    """New user, mount and network namespaces for this process (and every child it forks later);
    with ``read_paths``, the file view too."""
    _namespaces(report, read_paths)


def _namespaces(report: Report, read_paths: list[str] | None = None) -> None:
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC) == 0:
        report.applied += ["userns", "netns", "ipcns"]
        if read_paths is not None:
            try:
                _fsview(libc, read_paths, uid, gid)
                report.applied.append("fsview")
            except OSError as exc:
                report.missing["fsview"] = f"file view: {exc}"
            try:
                drop_capabilities(libc)
            except OSError as exc:  # the view's directories could then be listed (not read beyond it)
                report.missing["nocaps"] = f"capabilities not dropped: {exc}"
        return
    problem = os.strerror(ctypes.get_errno())
    if read_paths is not None:
        report.missing["fsview"] = f"no user namespace: {problem}"
    # As root without a user namespace, network and IPC namespaces alone still work.
    if libc.unshare(_CLONE_NEWNET | _CLONE_NEWIPC) == 0:
        report.applied += ["netns", "ipcns"]
        report.missing["userns"] = problem
    else:
        report.missing["userns"] = report.missing["netns"] = report.missing["ipcns"] = os.strerror(ctypes.get_errno())


def _mount(libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    enc = (lambda v: v.encode() if v is not None else None)
    if libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source or ''} {target}: {os.strerror(err)}")


def _syscall_number(name: str) -> int:
    import platform

    numbers = {"pivot_root": {"x86_64": 155, "aarch64": 41}, "capset": {"x86_64": 126, "aarch64": 91}}
    number = numbers[name].get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"{name}: unknown syscall number on {platform.machine()}")
    return number


def drop_capabilities(libc: ctypes.CDLL | None = None) -> None:
    """No capability left, in any set, for this process and what it forks. Inside its own user
    namespace a process holds every capability of that namespace (``CAP_DAC_READ_SEARCH`` would
    list the file view's directories whatever their mode); it needs none once the view is built."""
    libc = libc or _libc()
    for cap in range(64):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last capability
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2: all zero
    _syscall(libc, _syscall_number("capset"), ctypes.byref(header), ctypes.byref(data))


def _search_only_dirs(root: str, path: str) -> None:
    """``root + path`` and its missing parents, each mode 0111 (``os.makedirs`` gives its mode to
    the last directory only)."""
    current = root
    for part in path.strip("/").split("/"):
        current = f"{current}/{part}" if part else current
        if not os.path.lexists(current):
            os.mkdir(current, 0o111)
            os.chmod(current, 0o111)  # whatever the umask


# Directories the file view's tmpfs may be mounted on (it then becomes the root): the first that
# exists and holds no read path is taken. Any common top-level directory will do, since the mount
# hides it only in this process's own mount namespace.
VIEW_ROOTS = ("/tmp", "/mnt", "/srv", "/media", "/opt", "/proc")


def _holds(directory: str, path: str) -> bool:
    """Whether a mount on ``directory`` would hide ``path``, or part of it."""
    return path == directory or path.startswith(directory + "/") or directory.startswith(path.rstrip("/") + "/")


def _view_sources(read_paths: list[str]) -> list[tuple[str, bool]]:
    """The read paths the view binds: real paths, each with whether it is a directory, none
    beneath another. Looked at on the host before anything is mounted.

    A path that does not exist on this host is left out, as Landlock leaves it out: callers name
    paths an installation may lack (``/usr/share/zoneinfo`` on an image without tzdata). Any other
    reason not to see a path that is there is an error naming it: a path left out silently makes
    the worker fail much later, and far from the cause (``ModuleNotFoundError`` in every app)."""
    sources: list[tuple[str, bool]] = []
    for path in sorted({os.path.realpath(p) for p in read_paths}):
        if any(path == s or path.startswith(s + "/") for s, _ in sources):
            continue  # visible through a bound parent
        try:
            mode = os.stat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise OSError(exc.errno, f"read path {path} cannot be shown in the file view: {exc.strerror}") from None
        sources.append((path, stat.S_ISDIR(mode)))
    return sources


def _view_root(sources: list[str]) -> str:
    """The directory to build the view on: the first of :data:`VIEW_ROOTS` whose tmpfs would hide
    none of ``sources``. The tmpfs hides what the host has there before the paths are bound from
    the host, so a virtualenv or a checkout under ``/tmp`` moves the view to ``/mnt``."""
    why: list[str] = []
    for root in VIEW_ROOTS:
        if not os.path.isdir(root) or os.path.islink(root):
            why.append(f"{root} missing")
            continue
        hidden = [p for p in sources if _holds(root, p)]
        if not hidden:
            return root
        why.append(f"{root} holds {hidden[0]}")
    raise OSError(errno.ENOENT, f"no directory to build the file view on ({'; '.join(why)})")


def _show(libc: ctypes.CDLL, root: str, path: str, is_dir: bool) -> None:
    """Bind host ``path`` read-only at ``root + path``; an OSError names ``path``."""
    target = root + path
    try:
        if is_dir:
            _search_only_dirs(root, path)
        else:
            _search_only_dirs(root, os.path.dirname(path))
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o444))
        _mount(libc, path, target, None, _MS_BIND)
        # Read-only; a remount in a user namespace must keep the flags the host locked on the source.
        f = os.statvfs(path).f_flag
        kept = (f & (_MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_NOATIME | _MS_NODIRATIME)) | \
            (_MS_RELATIME if f & _ST_RELATIME else 0)
        _mount(libc, None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | kept)
    except OSError as exc:
        raise OSError(exc.errno, f"read path {path} cannot be shown in the file view: {exc.strerror or exc}") from None


def _fsview(libc: ctypes.CDLL, read_paths: list[str], uid: int, gid: int) -> None:
    """Make this mount namespace's root a read-only tmpfs holding only ``read_paths`` (read-only
    bind mounts at the same absolute paths). Needs a fresh user and mount namespace (this process
    is their owner, so it may mount); every child inherits the view, and seccomp keeps children
    from mounting, unsharing or pivoting again.

    Each read path either appears in the view or this raises an OSError naming it (only a path
    missing on the host is left out, see :func:`_view_sources`). The view is built on a directory
    that holds no read path (:func:`_view_root`), so its tmpfs never hides a path before it is
    bound; that needs only plain mounts (no ``/proc/self/fd`` source, which would be gone if the
    view were built on ``/proc``). A failure before the switch of root unmounts the tmpfs again:
    the process keeps the host's files (Landlock still limits them) and the report says why."""
    try:
        with open("/proc/self/setgroups", "w") as f:  # needed before gid_map by Linux, not by gVisor
            f.write("deny")
    except OSError:
        pass  # gVisor (spring 2026) has no writable setgroups; the maps below are what matters
    for name, line in (("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:  # identity maps: files keep their owners
            f.write(line)
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing propagates back to the host
    sources = _view_sources(read_paths)
    root = _view_root([path for path, _ in sources])
    # The view's own directories are search-only (mode 0111): paths through them resolve, nothing
    # lists them (the bound paths keep their modes, as under Landlock). Capabilities are dropped
    # after the view is built, so no DAC override reads them either.
    try:
        _mount(libc, "awm-view", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0111,size=64k,nr_inodes=4096")
    except OSError as exc:  # gVisor of spring 2026 knows no size options (the root goes read-only anyway)
        if exc.errno != errno.EINVAL:
            raise
        _mount(libc, "awm-view", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0111")
    try:
        for path, is_dir in sources:
            _show(libc, root, path, is_dir)
        # Merged-/usr systems reach libraries through /lib -> usr/lib and the like (ld.so's default
        # search path, paths recorded in extension modules): the same symlinks in the view.
        for link in ("/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin"):
            if os.path.islink(link) and not os.path.lexists(root + link):
                os.symlink(os.readlink(link), root + link)
        old = root + "/.old"
        os.mkdir(old)
    except BaseException:
        libc.umount2(root.encode(), _MNT_DETACH)  # the host's directory again, bound paths and all
        raise
    _syscall(libc, _syscall_number("pivot_root"), root.encode(), old.encode())
    os.chdir("/")
    if libc.umount2(b"/.old", _MNT_DETACH) != 0:
        raise OSError(ctypes.get_errno(), "umount2 /.old")
    os.rmdir("/.old")
    _mount(libc, None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


# Limits that only back up seccomp (mq_open is refused; mlock pins at most the worker's own memory):
# where a runtime refuses to change them (gVisor refuses RLIMIT_MSGQUEUE) the report says so.
_BACKUP_RLIMITS = ("RLIMIT_MEMLOCK", "RLIMIT_MSGQUEUE")


def _rlimits(limits: Limits, report: Report) -> None:
    memory = limits.memory_mb * 1024 * 1024
    for name, value in (("RLIMIT_AS", memory), ("RLIMIT_CPU", limits.cpu_s), ("RLIMIT_FSIZE", 0),
                        ("RLIMIT_CORE", 0), ("RLIMIT_NOFILE", limits.open_files), ("RLIMIT_NPROC", 0),
                        ("RLIMIT_MEMLOCK", 0), ("RLIMIT_MSGQUEUE", 0)):
        which = getattr(resource, name)
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)  # lowering only: a runtime may already hold it lower
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError) as exc:
            if name not in _BACKUP_RLIMITS:
                raise ConfinementError(f"setrlimit {name}={value}: {exc}") from None
            report.missing[name.lower()] = f"not lowered: {exc}"
    report.applied.append("rlimits")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _fs_rights(abi: int) -> int:
    rights = (1 << 13) - 1  # EXECUTE .. MAKE_SYM (ABI 1)
    if abi >= 2:
        rights |= 1 << 13  # REFER
    if abi >= 3:
        rights |= 1 << 14  # TRUNCATE
    if abi >= 5:
        rights |= 1 << 15  # IOCTL_DEV
    return rights


def landlock_ruleset(read_paths: list[str], abi: int) -> int:
    """A Landlock ruleset that allows reading ``read_paths`` only (and no TCP): its descriptor,
    the caller's to close. Built once by a fork server and applied by each child it forks, which
    then restricts itself with one call instead of opening and adding every path again."""
    libc = _libc()
    attr = _RulesetAttr(_fs_rights(abi), (_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0,
                        (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0)
    # Older kernels reject fields they do not know: pass only the prefix this ABI understands.
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = _syscall(libc, _SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                       ctypes.c_uint32(0))
    try:
        for path in read_paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a path this installation does not have
            try:
                is_dir = os.path.isdir(path)
                rule = _PathBeneathAttr(_FS_READ_FILE | (_FS_READ_DIR if is_dir else 0), fd)
                _syscall(libc, _SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset),
                         ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0))
            finally:
                os.close(fd)
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


def _landlock(read_paths: list[str], report: Report, ruleset: int | None = None) -> None:
    """Restrict this process to ``read_paths``; with ``ruleset`` (from :func:`landlock_ruleset`,
    built for the same paths) that one is applied, and closed."""
    abi = report.landlock_abi = landlock_abi()
    if abi < 1:
        report.missing["landlock"] = "kernel without Landlock (needs Linux >= 5.13 with landlock in lsm=)"
        return
    libc = _libc()
    if ruleset is None:
        ruleset = landlock_ruleset(read_paths, abi)
    try:
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise ConfinementError("prctl(PR_SET_NO_NEW_PRIVS) failed")
        _syscall(libc, _SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    report.applied.append("landlock")
    if abi < 4:
        report.missing["landlock-net"] = f"Landlock ABI {abi} < 4"
    if abi < 6:
        report.missing["landlock-scope"] = f"Landlock ABI {abi} < 6 (signals to other processes rest on seccomp)"


# A pid no process can have (above the kernel's PID_MAX_LIMIT, 2**22): a program built ahead
# (by the fork server, once) names the caller with it, and the caller patches in its own pid.
PID_PLACEHOLDER = 0x7FFFFFF0


def _filter(me: int) -> object:
    import pyseccomp as sc

    deny = sc.ERRNO(errno.EPERM)
    flt = sc.SyscallFilter(defaction=sc.ALLOW)
    for name in DENIED_SYSCALLS:
        _add(flt, deny, name)
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    # Signals only to itself (raise(), abort()): kill(0 or -pgrp) and other pids are refused.
    flt.add_rule(deny, "kill", sc.Arg(0, sc.NE, me))
    flt.add_rule(deny, "tgkill", sc.Arg(0, sc.NE, me))
    flt.add_rule(deny, "tkill", sc.Arg(0, sc.NE, me))
    # Calls that act on another process of the same uid (another instance's env server, the
    # Postgres postmaster when it shares the uid): allowed on the caller only, spelt pid 0 (as libc
    # and Python spell "myself"). Any other target - a pid, a process group, a user - is refused.
    for name, arg in SELF_ONLY_SYSCALLS:
        _add(flt, deny, name, sc.Arg(arg, sc.NE, 0))
    _add(flt, deny, "setpriority", sc.Arg(0, sc.NE, 0))  # PRIO_PGRP, PRIO_USER: others too
    _add(flt, deny, "ioprio_set", sc.Arg(0, sc.NE, 1))   # IOPRIO_WHO_PGRP, IOPRIO_WHO_USER
    # Asking the kernel to signal another process on I/O (F_SETOWN and relatives, and their ioctl
    # spellings): the signal comes from the kernel, so the kill() rules above never see it.
    # The kernel reads both commands as 32-bit ``unsigned int``s: compared on their low 32 bits,
    # or a command with bit 32 set would pass the rule and still be F_SETOWN to the kernel.
    for command in FCNTL_SIGNAL_COMMANDS:
        _add(flt, deny, "fcntl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, command))
    for request in IOCTL_SIGNAL_REQUESTS:
        _add(flt, deny, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    return flt


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class SeccompProgram:
    """The filter as a classic BPF program in memory, with :data:`PID_PLACEHOLDER` for the
    caller's pid: built once by a fork server (libseccomp takes ~1.5 ms to build it; the buffer
    and the placeholders' offsets are found once too), loaded by each child with its own pid
    written in."""

    def __init__(self, code: bytes) -> None:
        placeholder = PID_PLACEHOLDER.to_bytes(4, "little")
        # struct sock_filter {u16 code; u8 jt, jf; u32 k}: the placeholders are constants k
        self.offsets = [o + 4 for o in range(0, len(code), 8) if code[o + 4:o + 8] == placeholder]
        self._buffer = ctypes.create_string_buffer(code, len(code))
        self._fprog = _SockFprog(len(code) // 8, ctypes.cast(self._buffer, ctypes.c_void_p))

    @classmethod
    def build(cls) -> SeccompProgram | None:
        """None where libseccomp is unavailable."""
        if seccomp_problem() is not None:
            return None
        fd = os.memfd_create("awm-seccomp")
        try:
            with os.fdopen(os.dup(fd), "wb") as out:
                _filter(PID_PLACEHOLDER).export_bpf(out)  # type: ignore[attr-defined]
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            return cls(b"".join(chunks))
        finally:
            os.close(fd)

    def load(self, me: int) -> None:
        """Install the filter on this process, with ``me`` as the caller's pid (this process's
        copy of the buffer: a fork server's children each write their own)."""
        mine = me.to_bytes(4, "little")
        base = ctypes.addressof(self._buffer)
        for offset in self.offsets:
            ctypes.memmove(base + offset, mine, 4)
        libc = _libc()
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
        if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(self._fprog), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


def _seccomp(report: Report, program: SeccompProgram | None = None) -> None:
    problem = seccomp_problem()
    if problem is not None:
        report.missing["seccomp"] = problem
        return
    if program is not None:
        program.load(os.getpid())
    else:
        _filter(os.getpid()).load()  # type: ignore[attr-defined]  # sets no_new_privs itself
    report.applied.append("seccomp")


LAYERS = ("namespaces", "fsview", "rlimits", "landlock", "seccomp")


def confine(read_paths: list[str], limits: Limits, layers: tuple[str, ...] = LAYERS,
            namespaces: Report | None = None, seccomp: SeccompProgram | None = None,
            ruleset: int | None = None) -> Report:
    """Apply every layer this kernel offers, strongest last. Irreversible for this process.

    ``layers`` exists to measure what each layer costs (``bench/runtime.py``); leaving one out
    makes the report weak, and the server then refuses to run code unless told otherwise.
    ``namespaces`` is what the fork server entered for all its children (:mod:`.forkserver`):
    reported, not entered again; ``seccomp`` and ``ruleset`` are its prebuilt filter and Landlock
    ruleset (:func:`landlock_ruleset` of these ``read_paths``; its descriptor is closed here)."""
    report = Report()
    seccomp_problem()  # loads libseccomp (and runs ldconfig) while files and processes are allowed
    if namespaces is not None:
        report.applied += namespaces.applied
        report.missing.update(namespaces.missing)
    elif "namespaces" in layers:
        _namespaces(report, read_paths if "fsview" in layers else None)
    if "rlimits" in layers:
        _rlimits(limits, report)
    if "landlock" in layers:
        _landlock(read_paths, report, ruleset)
    elif ruleset is not None:
        os.close(ruleset)
    if "seccomp" in layers:
        _seccomp(report, seccomp)
    for layer in set(LAYERS) - set(layers):
        report.missing[layer] = "switched off (AWM_SANDBOX_LAYERS)"
    return report
