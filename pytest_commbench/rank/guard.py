"""The run-time guard of a Python solution: a PEP 578 audit hook, installed by the rank
harness right before it loads the solution, that ends the rank when the code running in it
reaches for what would get around the task's rules or the harness:

- native code: importing ctypes / _ctypes / cffi (they are taken out of sys.modules, so the
  import is seen even where numpy loaded ctypes), any `ctypes.*` event (every use of the
  harness's ctypes objects too), extension modules from outside the Python installation;
- code from strings or bytes: `compile` / `exec` / `function.__new__` of anything but the
  solution file (once, with the content it had at install) and the installation's own modules
  (lazy imports of the stdlib, numpy, cupy, scipy), `marshal.loads` of anything but the .pyc
  that importlib has just opened, `code.__new__`, `pickle.find_class` beyond plain numpy data;
- introspection: `sys._getframe`, `sys._current_frames`, frame/code attributes of functions,
  tracebacks and generators (`object.__getattr__`), `gc.get_objects` / `get_referrers` /
  `get_referents`, `sys.settrace` / `setprofile`, `sys.monitoring.register_callback`,
  `sys.addaudithook`, writes to `function.__code__` and to the harness's classes
  (`object.__setattr__`), sub-interpreters (they would run without this hook);
- processes, FIFOs and shared memory, by any route: `os.system`, `os.exec*`,
  `os.posix_spawn*`, `os.spawn*`, `os.fork`, `os.forkpty`, `pty.spawn`, `subprocess.Popen`
  (their own events); `_posixsubprocess.fork_exec` (what Popen and multiprocessing call
  underneath), `os.mkfifo` / `os.mknod` and `_posixshmem.shm_open` / `shm_unlink` raise no
  event, so `install` replaces them, wherever a reference to them is kept (module dicts of
  os, posix, subprocess, _posixsubprocess, _posixshmem; os.supports_* sets), by functions
  that raise one; importing the private modules that hand such things out (`_BLOCKED`:
  _posixsubprocess, _posixshmem, _multiprocessing, the sub-interpreter and CPython test
  modules) is refused by name, by the name an extension's init function is looked up by and
  by its file's name; and `_imp.create_builtin` (how importlib makes built-in modules, with
  no event) is replaced by a gate that lets the hook refuse a fresh copy of posix, of _imp or
  of a blocked module. Behind all of it a seccomp filter (x86_64, aarch64) makes fork, vfork,
  clone without CLONE_THREAD, execve, execveat and mknod* fail with EPERM for routes nobody
  listed (native code of the installation included): harmless, though not reported;
- the filesystem: opening for anything but reading outside the `writable` folders, removing,
  renaming, creating folders, changing modes or times outside them, links of any kind,
  descriptors of folders outside them and relative paths that climb with ".." (a folder's
  descriptor would move a relative path where this check cannot see);
- the harness: importing any module whose name starts with one of `hidden_modules` (they are
  taken out of sys.modules too, so `import` cannot just find them there).

Let through, because the standard library and the packages do it themselves: ast.parse (a
syntax tree; np.load reads its header with it), namedtuple's generated `__new__`, the
functions that call sys._getframe only to read their caller's module name (typing, enum),
and what the top-level code of an installation module does while it is being imported
(scipy's dataclasses, reading `__code__`, `import ctypes`, loading a library that is not in
`writable`), as long as no frame of anything outside the installation is in between.

A refusal writes one JSON line {"forbidden": "<event>", "detail": "... (at file:line)"} to the
report file (created only then), says the same on stderr and ends the process with
`os._exit(86)` at once: an exception alone could be caught by the solution.

What the harness must do, in this order: import everything it will use and warm up what loads
libraries lazily (cupy: `getattr(cupy_backends.cuda.libs, name)` for cublas, cusolver,
cusparse, curand, nccl, nvrtc, and compile one kernel; it dlopens them with ctypes on first
use); point TMPDIR / `tempfile.tempdir` and CUPY_CACHE_DIR into `writable`; arm the preloaded
interposer (`ctypes.CDLL(None).commbench_guard_arm()`: ctypes is refused afterwards);
`install(...)`; load the solution (importlib or compile+exec of its file, once). `install`
imports subprocess (so a later `import subprocess` needs no _posixsubprocess); after it the
process, the harness included, starts no process and makes no FIFO. After install
no module of `hidden_modules` can be imported, the harness's own lazy imports included; the
harness must not use `traceback` / `logging` / `inspect` (they read frames): the formatter
that `install` returns describes a solution's exception safely.

This module imports nothing from the package and only the standard library. The hook binds
every function it uses when it is installed and never calls the solution's code (no
isinstance, hashing, __fspath__ or __str__ of its objects), so patching `os`, `json`,
builtins or pathlib changes nothing in it. A function's closure and `__globals__` raise no
audit event, so every function of the guard a solution can reach (the formatter the harness
keeps, the stand-ins, the gate) holds none of the hook's state: the hook knows the formatter
by its code object.
"""

from __future__ import annotations

import _imp
import _thread
import ast
import collections
import json
import os
import pathlib
import stat
import sys
import sysconfig
import types
from collections.abc import Callable
from importlib.util import cache_from_source

from .protocol import GUARD_EXIT

# refused whatever their arguments
_ALWAYS = {
    "sys._current_frames": "frame introspection",
    "sys._current_exceptions": "frame introspection",
    "object.__getattr__": "frame or code attributes",
    "gc.get_objects": "object graph introspection", "gc.get_referrers": "object graph introspection",
    "gc.get_referents": "object graph introspection",
    "sys.settrace": "tracing", "sys.setprofile": "profiling",
    "sys.monitoring.register_callback": "sys.monitoring", "sys.addaudithook": "another audit hook",
    "code.__new__": "building code objects", "marshal.load": "marshal",
    "cpython.PyInterpreterState_New": "a sub-interpreter",
    "os.system": "a new process", "os.exec": "a new process", "os.posix_spawn": "a new process",
    "os.spawn": "a new process", "os.fork": "a new process", "os.forkpty": "a new process",
    "subprocess.Popen": "a new process", "_posixsubprocess.fork_exec": "a new process",
    "os.startfile": "a new process", "pty.spawn": "a new process",
    "os.symlink": "a link", "os.link": "a link",
    # no audit event of their own: the functions are replaced by ones that raise these
    "os.mkfifo": "a FIFO", "os.mknod": "a FIFO or device node",
    "_posixshmem.shm_open": "shared memory outside the harness",
    "_posixshmem.shm_unlink": "shared memory outside the harness",
    "_multiprocessing.sem_unlink": "a named semaphore outside the harness",
}
# private modules no solution may import (nor have _imp make): each hands out what no audit
# event shows, or CPython's test internals
_PROCESS, _SHM, _INTERP, _TESTS = ("a new process (fork_exec raises no audit event)",
                                   "shared memory or semaphores outside the harness",
                                   "a sub-interpreter (it would run without this hook)",
                                   "CPython's test internals")
_BLOCKED = {
    "_posixsubprocess": _PROCESS, "_posixshmem": _SHM, "_multiprocessing": _SHM,
    "_xxsubinterpreters": _INTERP, "_xxinterpchannels": _INTERP, "_xxinterpqueues": _INTERP,
    "_interpreters": _INTERP, "_interpchannels": _INTERP, "_interpqueues": _INTERP,
    "_remote_debugging": "reading other processes' memory",
    **{name: _TESTS for name in (
        "_testcapi", "_testinternalcapi", "_testbuffer", "_testmultiphase", "_testsinglephase",
        "_testimportmultiple", "_testclinic", "_testclinic_limited", "_testlimitedcapi",
        "_testexternalinspection", "_xxtestfuzz", "_ctypes_test", "xxlimited", "xxlimited_35",
        "xxsubtype", "_testconsole")},
}
_BLOCKED_PREFIXES = ("_test", "_xx")  # of top-level names: test modules of later versions
# built-in modules of which _imp must not make a fresh copy (the loaded one is defanged)
_NO_COPY = {"posix": "a fresh copy of posix (fork_exec's and mkfifo's module)",
            "_imp": "a fresh copy of _imp (it makes built-in modules)"}
# functions that raise no audit event, replaced wherever a reference to them is kept (module
# dicts, os.supports_* sets): (module, name, the event their replacement raises)
_DEFANGED = (("posix", "mkfifo", "os.mkfifo"), ("posix", "mknod", "os.mknod"),
             ("_posixsubprocess", "fork_exec", "_posixsubprocess.fork_exec"),
             ("_posixshmem", "shm_open", "_posixshmem.shm_open"),
             ("_posixshmem", "shm_unlink", "_posixshmem.shm_unlink"),
             ("_multiprocessing", "sem_unlink", "_multiprocessing.sem_unlink"))
_NATIVE_MODULES = ("ctypes", "_ctypes", "cffi", "_cffi_backend")
_CTYPES = "native calls through ctypes"
# path-writing events: (argument positions of paths, of dir_fds)
_PATH_EVENTS = {
    "os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
    "os.rename": ((0, 1), (2, 3)), "os.truncate": ((0,), ()), "os.chmod": ((0,), (2,)),
    "os.chown": ((0,), (3,)), "os.utime": ((0,), (3,)), "os.setxattr": ((0,), ()),
    "os.removexattr": ((0,), ()), "os.chflags": ((0,), ()), "os.lchflags": ((0,), ()),
}
# what a pickle of numpy arrays and plain data may name
_PICKLE_OK = {
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("builtins", "complex"), ("builtins", "set"), ("builtins", "frozenset"),
    ("builtins", "bytearray"), ("builtins", "slice"), ("builtins", "range"),
    ("collections", "OrderedDict"), ("copyreg", "_reconstructor"), ("builtins", "object"),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# pathlib objects reach `open` as they are (3.12+): their path is read from the `_str` slot
# their own __fspath__ has just filled, and only while their methods are pathlib's own
_PATH_CLASSES = tuple((t, t.__fspath__, t.__str__) for t in (pathlib.PosixPath, pathlib.PurePosixPath))
_PATH_SLOT = pathlib.PurePath.__dict__.get("_str")


def _normal(path: str, cwd: str) -> str:
    """An absolute path with no `.`, `..` or doubled slashes (symlinks left as they are)."""
    if not path.startswith("/"):
        path = cwd + "/" + path
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part and part != ".":
            parts.append(part)
    return "/" + "/".join(parts)


def _within(path: str, folders: tuple[str, ...]) -> bool:
    for folder in folders:
        if folder == "/" or path == folder or path.startswith(folder + "/"):
            return True
    return False


def _installation(exclude: tuple[str, ...]) -> tuple[str, ...]:
    """Where Python's own modules and the installed packages are (lazy imports come from
    there), less the given folders."""
    found = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            found.add(path)
    found.update(p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p))
    folders = set()
    for path in found:
        for variant in (os.path.abspath(path), os.path.realpath(path)):
            if os.path.isdir(variant) and not _within(variant, exclude):
                folders.add(variant)
    return tuple(sorted(folders))


def _hidden_folders(prefixes: tuple[str, ...]) -> tuple[str, ...]:
    """The folders the hidden modules were loaded from."""
    folders = set()
    for name, module in list(sys.modules.items()):
        if name.startswith(prefixes):
            where = getattr(module, "__file__", None)
            if isinstance(where, str):
                folders.add(os.path.dirname(os.path.realpath(where)))
                folders.add(os.path.dirname(os.path.abspath(where)))
    return tuple(sorted(folders))


def _known_callers() -> tuple[tuple[object, dict], ...]:
    """Standard library functions whose audit events the guard lets through: ast.parse
    (compile to a syntax tree: np.load reads its header with it), collections.namedtuple
    (compiles a lambda over checked identifiers) and, in 3.10/3.11, the functions that call
    sys._getframe only to read their caller's module name (namedtuple, typing.TypeVar and
    NamedTuple, the functional Enum API)."""
    import enum
    import typing

    found = []
    for module, path in ((ast, "parse"), (collections, "namedtuple"), (typing, "_caller"),
                         (typing, "TypeVar.__init__"), (typing, "ParamSpec.__init__"),
                         (enum, "EnumMeta._create_"), (enum, "EnumType._create_")):
        obj = module
        for part in path.split("."):
            obj = getattr(obj, part, None)
        code = getattr(obj, "__code__", None)
        if code is not None and (code, vars(module)) not in found:
            found.append((code, vars(module)))
    return tuple(found)


def _refusing(event: str, audit: Callable) -> Callable:
    """The stand-in of a function that raises no audit event: it raises `event` (the hook
    ends the process) and, should the event ever come back, does nothing. It holds nothing of
    the guard's: a solution can read any function's closure."""
    def refused(*args: object, **kwargs: object) -> None:
        audit(event)
        raise PermissionError(event + " is refused by the commbench guard")

    refused.__name__ = refused.__qualname__ = event.rpartition(".")[2]
    return refused


def _builtin_gate(audit: Callable) -> Callable:
    """The stand-in of `_imp.create_builtin`, with which importlib makes every built-in
    module: the hook checks the name and makes the module (only the hook holds the real
    function, so no fresh, undefanged copy of posix or _imp can be had)."""
    def create_builtin(spec: object) -> object:
        box: list = []
        audit("_imp.create_builtin", spec.name, box)
        if len(box) != 1:
            raise ImportError("the commbench guard made no module")
        return box[0]

    return create_builtin


def _defang(audit: Callable) -> Callable:
    """Replace the functions of `_DEFANGED` and `_imp.create_builtin` wherever a reference to
    them is kept (module dicts, os.supports_* sets; found as their referrers); returns the
    real create_builtin. subprocess is imported first, so a later `import subprocess`
    (numpy.testing has one) finds it without importing _posixsubprocess, which is refused."""
    import gc

    try:
        import subprocess  # noqa: F401 - imported for the modules that import it later
    except ImportError:
        pass
    builtin = type(len)
    originals, stand_ins = [], []
    for module_name, attr, event in _DEFANGED:
        fn = getattr(sys.modules.get(module_name), attr, None)
        if type(fn) is builtin:
            originals.append(fn)
            stand_ins.append(_refusing(event, audit))
    real = _imp.create_builtin
    if type(real) is builtin:
        originals.append(real)
        stand_ins.append(_builtin_gate(audit))
    by_id = {id(o): s for o, s in zip(originals, stand_ins)}
    for holder in gc.get_referrers(*originals):
        if type(holder) is dict:
            for key, value in list(holder.items()):
                if id(value) in by_id:
                    holder[key] = by_id[id(value)]
        elif type(holder) is list:
            for i, value in enumerate(holder):
                if id(value) in by_id:
                    holder[i] = by_id[id(value)]
        elif type(holder) is set:
            for value in [v for v in holder if id(v) in by_id]:
                holder.discard(value)
                holder.add(by_id[id(value)])
    return real


# the seccomp backstop: per machine, (audit arch, seccomp's number, calls refused with EPERM
# (fork, vfork, execve, execveat, mknod, mknodat), clone, clone3, x32's bit)
_SECCOMP = {"x86_64": (0xC000003E, 317, (57, 58, 59, 322, 133, 259), 56, 435, 0x40000000),
            "aarch64": (0xC00000B7, 277, (221, 281, 33), 220, 435, None)}


def _seccomp() -> bool:
    """A seccomp filter on every thread of the process: no new process (fork, vfork, clone
    without CLONE_THREAD; clone3 answers ENOSYS, so the C library falls back to clone for
    threads), no new program (execve, execveat) and no FIFO or device node (mknod*) by any
    route, Python or native; they fail with EPERM. It backs up the hook for routes nobody
    listed (the hook refuses every route it knows first). False where it cannot be set."""
    import ctypes

    spec = _SECCOMP.get(os.uname().machine)
    if spec is None or sys.byteorder != "little":
        return False
    arch, nr_seccomp, denied, clone, clone3, x32 = spec
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    code: list = [(ld, 0, 0, 4), (jeq, 0, "deny", arch), (ld, 0, 0, 0)]
    if x32 is not None:
        code.append((jge, "deny", 0, x32))
    code += [(jeq, "deny", 0, nr) for nr in denied]
    code += [(jeq, "enosys", 0, clone3), (jeq, "clone", 0, clone), (ret, 0, 0, allow),
             "clone", (ld, 0, 0, 16), (jset, "allow", "deny", 0x00010000),  # CLONE_THREAD
             "allow", (ret, 0, 0, allow), "enosys", (ret, 0, 0, enosys), "deny", (ret, 0, 0, eperm)]
    at, n = {}, 0
    for item in code:
        if isinstance(item, str):
            at[item] = n
        else:
            n += 1
    program, n = [], 0
    for item in code:
        if isinstance(item, str):
            continue
        op, jt, jf, k = item
        jt = at[jt] - n - 1 if isinstance(jt, str) else jt
        jf = at[jf] - n - 1 if isinstance(jf, str) else jf
        program.append((op, jt, jf, k))
        n += 1

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    table = (Filter * len(program))(*[Filter(*ins) for ins in program])
    prog = Program(len(program), table)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        ulong, long_ = ctypes.c_ulong, ctypes.c_long
        if libc.prctl(38, ulong(1), ulong(0), ulong(0), ulong(0)) != 0:  # PR_SET_NO_NEW_PRIVS
            return False
        libc.syscall.restype = long_
        # SECCOMP_SET_MODE_FILTER with SECCOMP_FILTER_FLAG_TSYNC: every thread at once
        if libc.syscall(long_(nr_seccomp), ulong(1), ulong(1), ctypes.byref(prog)) == 0:
            return True
        # this thread and the threads it starts (the solution's), where TSYNC is refused
        return libc.prctl(22, ulong(2), ctypes.byref(prog), ulong(0), ulong(0)) == 0
    except (OSError, AttributeError):
        return False


def install(*, solution: str, writable: list[str], report: str,
            hidden_modules: list[str], seccomp: bool = True) -> Callable[[BaseException], str]:
    """Install the guard (once per process; it cannot be removed). Returns a function that
    formats a solution's exception with its traceback without tripping the guard (the only
    safe way to read frames afterwards). `seccomp`: set the seccomp backstop too."""
    # Everything the hook uses is bound here: a solution may patch os, json, builtins or
    # pathlib. Nothing in the hook runs the solution's code either (no isinstance, which
    # reads __class__; no hashing or comparing of its objects; no __fspath__ / __str__):
    # while the hook runs, the events it causes itself pass.
    _exit, _write, _open, _close, _read = os._exit, os.write, os.open, os.close, os.read
    _getcwd, _stat, _ident, _s_isdir = os.getcwd, os.stat, _thread.get_ident, stat.S_ISDIR
    _type, _issubclass, _len, _any = type, issubclass, len, any
    _str, _bytes, _int, _bytearray, _memoryview = str, bytes, int, bytearray, memoryview
    _str_copy, _str_encode, _bytes_decode = str.__str__, str.encode, bytes.decode
    _bytes_copy, _view_bytes, _int_repr = bytes.__getitem__, memoryview.tobytes, int.__repr__
    _escape = json.encoder.encode_basestring_ascii
    _code_type = _type(install.__code__)
    _type_module = type.__dict__["__module__"].__get__
    _type_name = type.__dict__["__name__"].__get__
    _exc_args = BaseException.__dict__["args"].__get__
    _exc_tb = BaseException.__dict__["__traceback__"].__get__
    _BaseException, _OSError, _SystemExit = BaseException, OSError, SystemExit
    _AttributeError, _slice, _enumerate, _type_type = AttributeError, slice, enumerate, type
    _normal_, _within_, _getframe = _normal, _within, sys._getframe
    _ast_parse, _namedtuple = ast.parse.__code__, collections.namedtuple.__code__
    _known = _known_callers()  # code -> its module's globals
    _this_file = install.__code__.co_filename
    _always, _path_events, _pickle_ok = dict(_ALWAYS), dict(_PATH_EVENTS), frozenset(_PICKLE_OK)
    _path_classes, _path_slot = _PATH_CLASSES, _PATH_SLOT
    _native, _GUARD_EXIT, _CTYPES_ = _NATIVE_MODULES, GUARD_EXIT, _CTYPES
    _blocked_, _blocked_prefixes, _no_copy = dict(_BLOCKED), _BLOCKED_PREFIXES, dict(_NO_COPY)
    _list, _list_append, _namespace, _TESTS_ = list, list.append, types.SimpleNamespace, _TESTS
    _loading = frozenset({"ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle"})
    O_RDONLY, O_CLOEXEC, O_DIRECTORY, WRITE_FLAGS = os.O_RDONLY, os.O_CLOEXEC, _O_DIRECTORY, _WRITE_FLAGS
    O_REPORT = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC

    cwd = os.getcwd()
    report_path = _normal(os.fspath(report), cwd)
    solution_path = _normal(os.fspath(solution), cwd)
    solution_real = os.path.realpath(solution_path)
    with open(solution_path, "rb") as f:
        solution_source = f.read()
    solution_pyc = (cache_from_source(solution_path), cache_from_source(solution_real))
    writable_dirs = tuple(sorted({v for w in writable
                                  for v in (_normal(os.fspath(w), cwd), os.path.realpath(w))}))
    hidden = tuple(h for h in hidden_modules if h)
    untrusted = writable_dirs + _hidden_folders(hidden) + (os.path.dirname(solution_path),
                                                            os.path.dirname(solution_real))
    trusted = _installation(untrusted)
    left = {"compile": 1, "exec": 1}  # the solution's own module, loaded once
    last_pyc: dict[int, str] = {}  # per thread: the installation .pyc it opened last
    busy: set[int] = set()  # threads inside the hook (the events it causes itself pass)
    # a descriptor kept free for the report (a solution may have used up the rest); the report
    # file itself is only created on a refusal, so an empty file never stands for one
    reserve = os.open(os.devnull, O_RDONLY | O_CLOEXEC)

    def is_a(value: object, kind) -> bool:
        return _issubclass(_type(value), kind)

    def text(value: object) -> str:
        """What a report may say about a value, without calling any of its methods."""
        if is_a(value, _str):
            return _str_copy(value)[:300]
        if is_a(value, _bytes):
            return _bytes_decode(_bytes_copy(value, _slice(0, 300)), "utf-8", "replace")
        if is_a(value, _int):
            return _int_repr(value)
        return "<" + _type_name(_type(value))[:60] + ">"

    def refuse(event: str, detail: object) -> None:
        busy.add(_ident())  # the report's own open() is not checked
        try:  # where: the first frame outside the guard, and the first outside the installation
            frame, places = _getframe(1), []
            while frame is not None and _len(places) < 2:
                name = frame.f_code.co_filename
                outside = _type(name) is _str and not name.startswith("<") and not _within_(where(name), trusted)
                if name != _this_file and (not places or outside):
                    places.append(text(name) + ":" + _int_repr(frame.f_lineno))
                    if outside:
                        break
                frame = frame.f_back
            at = " (at " + ", from ".join(places) + ")" if places else ""
        except _BaseException:
            at = ""
        line = ('{"forbidden": ' + _escape(event) + ', "detail": ' + _escape(text(detail) + at)
                + "}\n").encode()
        try:
            try:
                _close(reserve)
            except _OSError:
                pass
            fd = _open(report_path, O_REPORT, 0o644)
            _write(fd, line)
            _close(fd)
        except _BaseException:
            pass
        try:
            _write(2, b"commbench guard: forbidden: " + line)
        except _BaseException:
            pass
        _exit(_GUARD_EXIT)
        raise _SystemExit(_GUARD_EXIT)  # not reached

    def fs_text(obj: object) -> str | None:
        """The path a file function was given, as it uses it; None where that cannot be
        told without running the caller's code."""
        if is_a(obj, _str):
            return _str_copy(obj)
        if is_a(obj, _bytes):
            return _bytes_decode(_bytes_copy(obj, _slice(None)), "utf-8", "surrogateescape")
        kind = _type(obj)
        for cls, fspath, to_str in _path_classes:
            if kind is cls and cls.__fspath__ is fspath and cls.__str__ is to_str and _path_slot:
                try:
                    value = _path_slot.__get__(obj)
                except _AttributeError:
                    return None
                return value if _type(value) is _str else None
        return None

    def file_bytes(path: str) -> bytes | None:
        try:
            fd = _open(path, O_RDONLY | O_CLOEXEC)
        except _OSError:
            return None
        try:
            chunks = []
            while True:
                chunk = _read(fd, 1 << 20)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
        finally:
            _close(fd)

    def as_bytes(source: object) -> bytes | None:
        if is_a(source, _str):
            return _str_encode(_str_copy(source), "utf-8", "surrogateescape")
        if is_a(source, _bytes):
            return _bytes_copy(source, _slice(None))
        if is_a(source, _bytearray) or is_a(source, _memoryview):
            return _view_bytes(_memoryview(source))
        return None  # an AST or something else built in memory

    def where(path: str) -> str:
        return _normal_(path, _getcwd())

    def blocked(name: str, path: str | None) -> str | None:
        """Why a module may not be imported (an extension module loaded from `path`):
        by its name, the name its init function is looked up by, or its file's name."""
        short = name.rpartition(".")[2]
        stem = path.rpartition("/")[2].partition(".")[0] if path else ""
        for candidate in (name, short, stem):
            if candidate in _blocked_:
                return _blocked_[candidate]
        if "." not in name and name.startswith(_blocked_prefixes):
            return _TESTS_
        return None

    def on_import(args: tuple) -> None:
        name = args[0]
        if _type(name) is not _str:
            refuse("import", name)
        name = _str_copy(name)
        extension = fs_text(args[1]) if _len(args) > 1 and args[1] is not None else None
        reason = blocked(name, extension)
        if reason is not None:
            refuse("import " + name, reason)
        if (name in _native or name.startswith(("ctypes.", "cffi."))) and not import_time():
            refuse("import " + name, "native calls through " + name)
        if name.startswith(hidden):
            refuse("import " + name, "the harness's modules are hidden from the solution")
        if _len(args) > 1 and args[1] is not None:  # an extension module is being loaded
            path = fs_text(args[1])
            if path is None or not _within_(where(path), trusted):
                refuse("import " + name, "native code from outside the installation: " + text(args[1]))

    def on_open(args: tuple) -> None:
        path, mode, flags = args[0], args[1], args[2]
        if is_a(path, _int):
            return  # wraps a descriptor the process already has
        flags = flags if _type(flags) is _int else 0
        writes = (flags & WRITE_FLAGS) != 0 or (
            _type(mode) is _str and _any(c in mode for c in "wax+"))
        name = fs_text(path)
        if name is None:
            if writes:
                refuse("open", "a path the guard cannot read: " + text(path))
            return
        raw, name = name, where(name)
        folder = (flags & O_DIRECTORY) != 0
        if mode is None and not folder:  # os.open
            try:
                folder = _s_isdir(_stat(name).st_mode)
            except _OSError:
                pass
        # a folder's descriptor (dir_fd=) moves relative paths where this check cannot see:
        # only folders inside the scratch folder, and no ".." in relative paths to write
        if folder and not _within_(name, writable_dirs):
            refuse("open", "a descriptor of a folder outside the scratch folder: " + name)
        if writes:
            if not raw.startswith("/") and ".." in raw.split("/"):
                refuse("open", "writing to a relative path with '..': " + raw)
            if not _within_(name, writable_dirs):
                refuse("open", "writing outside the scratch folder: " + name)
        elif name.endswith(".pyc") and (_within_(name, trusted) or name in solution_pyc):
            last_pyc[_ident()] = name

    def on_path(event: str, args: tuple) -> None:
        paths, dir_fds = _path_events[event]
        for k, i in _enumerate(paths):
            if i >= _len(args) or is_a(args[i], _int):
                continue
            name = fs_text(args[i])
            if name is None:
                refuse(event, "a path the guard cannot read: " + text(args[i]))
            j = dir_fds[k] if k < _len(dir_fds) else _len(args)
            fd = args[j] if j < _len(args) else None
            if fd is not None and not (_type(fd) is _int and fd in (-1, -100)) and not name.startswith("/"):
                # relative to a folder's descriptor, and those are only of folders inside
                # the scratch folder (see on_open): fine unless it climbs out with ".."
                if ".." in name.split("/"):
                    refuse(event, "a path with '..' relative to a folder's descriptor: " + name)
                continue
            if not _within_(where(name), writable_dirs):
                refuse(event, "outside the scratch folder: " + text(args[i]))

    def on_compile(args: tuple) -> None:
        source, filename = args[0], args[1]
        name = fs_text(filename) if filename is not None else None
        data = as_bytes(source)
        if name is None or data is None:
            refuse("compile", name or "code built in memory")
        full = where(name)
        if full == solution_path or full == solution_real:
            if left["compile"] > 0 and data == solution_source:
                left["compile"] -= 1
                return
            refuse("compile", "the solution's file a second time, or other text under its name")
        if _within_(full, trusted):
            if full.endswith(".py") and data == file_bytes(full):
                return  # a lazy import of a module of the installation, from its source
            refuse("compile", "text that is not the file it names: " + name)
        caller = called_from()
        if caller is _ast_parse or caller is _namedtuple or import_time():
            return  # ast.parse (np.load's header): a syntax tree, and any code it could make
            #         has a file name no exec / function.__new__ accepts; namedtuple: a
            #         lambda over field names it checked are identifiers; a module of the
            #         installation being imported (dataclasses in scipy, cupy's imports)
        refuse("compile", name)

    def loadable(event: str, args: tuple) -> bool:
        """A library to load (or look up a symbol in) that the solution cannot have written."""
        if event != "ctypes.dlopen" or not args or args[0] is None:
            return True
        name = fs_text(args[0])
        return name is not None and (
            "/" not in name or not _within_(where(name), untrusted))

    def import_time() -> bool:
        """Whether the event comes from the top-level code of a module of the installation
        being imported, with only the installation's code in between (a dataclass that scipy
        defines when cupy imports it: not the solution's)."""
        frame = _getframe(1)
        while frame is not None:
            code = frame.f_code
            name = code.co_filename
            if _type(name) is not _str:
                return False
            if name != _this_file and not name.startswith("<frozen "):
                if not _within_(where(name), trusted):
                    return False
                if code.co_name == "<module>":
                    return True
            frame = frame.f_back
        return False

    def called_from() -> object:
        """The code object of the function that raised the event where it is one of
        `_known_callers` (its own code, run with its own module's globals), else None."""
        frame = _getframe(1)
        while frame is not None and frame.f_code.co_filename == _this_file:
            frame = frame.f_back
        if frame is None:
            return None
        code = frame.f_code
        for known, namespace in _known:
            if code is known and frame.f_globals is namespace:
                return code
        return None

    def runnable(code: object, event: str) -> None:
        """Code may run if it is a module of the installation, frozen into the interpreter,
        or the solution's module once (the load)."""
        if _type(code) is not _code_type:
            refuse(event, code)
        name = code.co_filename
        if _type(name) is not _str:
            refuse(event, name)
        if name.startswith("<frozen "):
            return
        if event == "exec" and not name.startswith("/") and (called_from() is _namedtuple or import_time()):
            return  # "<string>": a namedtuple's __new__, or a module being imported (above)
        full = where(name)
        if full == solution_path or full == solution_real:
            if event == "exec" and left["exec"] > 0:
                left["exec"] -= 1
                return
            refuse(event, "the solution's code a second time")
        if _within_(full, trusted):
            return
        refuse(event, name)

    def on_marshal(args: tuple) -> None:
        data = as_bytes(args[0]) if args else None
        pyc = last_pyc.pop(_ident(), None)
        if data is not None and pyc is not None:
            content = file_bytes(pyc)
            if content is not None and content[16:] == data:
                return  # exactly the .pyc that importlib has just opened
        refuse("marshal.loads", "code or data that is no module of the installation")

    def on_setattr(args: tuple) -> None:
        obj, name = args[0], args[1]
        if _type(name) is _str and name == "__code__":
            refuse("object.__setattr__", "a function's __code__")
        if is_a(obj, _type_type):
            module = _type_module(obj)
            if _type(module) is _str and module.startswith(hidden):
                refuse("object.__setattr__", "a class of the harness: " + module)

    def on_create_builtin(args: tuple) -> None:
        """`_imp.create_builtin`'s stand-in asks (name, box): refused for the blocked
        modules and for posix and _imp themselves; the module is made by the hook."""
        if _len(args) != 2 or _type(args[0]) is not _str or _type(args[1]) is not _list:
            refuse("_imp.create_builtin", "a request the guard cannot read")
        name = args[0]
        reason = _no_copy.get(name) or blocked(name, None)
        if reason is not None:
            refuse("import " + name, reason)

    def on_getframe(args: tuple) -> None:
        if called_from() is None and not import_time():  # the stdlib's readers of their
            refuse("sys._getframe", "frame introspection")  # caller's module name pass

    def on_pickle(args: tuple) -> None:
        module, name = args[0], args[1]
        if _type(module) is _str and _type(name) is _str and (module, name) in _pickle_ok:
            return
        refuse("pickle.find_class", text(module) + "." + text(name))

    handlers = {"import": on_import, "open": on_open, "compile": on_compile,
                "exec": lambda args: runnable(args[0], "exec"),
                "function.__new__": lambda args: runnable(args[0], "function.__new__"),
                "marshal.loads": on_marshal, "object.__setattr__": on_setattr,
                "pickle.find_class": on_pickle, "sys._getframe": on_getframe,
                "_imp.create_builtin": on_create_builtin}
    for event in _path_events:
        handlers[event] = (lambda args, event=event: on_path(event, args))

    def hook(event: str, args: tuple) -> None:
        handler = handlers.get(event)
        if handler is None:
            reason = _always.get(event)
            if reason is None:
                if event[:7] != "ctypes.":
                    return  # the fast path: every other event
                reason = _CTYPES_
            ident = _ident()
            if ident in busy:
                return
            if event == "object.__getattr__" or event in _loading:
                busy.add(ident)
                try:  # the returned formatter reading a traceback (known by its code: a
                    # solution can call it, but nothing else can run as it); a module of the
                    # installation being imported may read its functions' __code__, or load
                    # a library of the machine
                    if event == "object.__getattr__" and _getframe(1).f_code is _format_code:
                        return
                    if import_time() and loadable(event, args):
                        return
                finally:
                    busy.discard(ident)
            refuse(event, reason)
        ident = _ident()
        if ident in busy:
            return
        busy.add(ident)
        try:
            handler(args)
        except _BaseException as exc:  # a check that cannot decide refuses
            refuse(event, "the guard could not check it: " + _type_name(_type(exc)))
        finally:
            busy.discard(ident)
        if event == "_imp.create_builtin":  # allowed: made here, its own events checked
            _list_append(args[1], _create_builtin(_namespace(name=args[0], origin="built-in")))

    def format_exception(exc: BaseException, limit: int = 4000) -> str:
        """`Type: message` and the traceback's file:line entries, without running any of the
        solution's code (no __str__ / __repr__ / __getattr__ of its objects). The message is
        the exception's arguments, each shown from what it is, never by asking it: text,
        bytes, numbers, None and booleans as they are, tuples and lists of them (a few levels
        deep), a numpy dtype by its scalar type's name (numpy's MemoryError carries a shape
        and a dtype), anything else as `<TypeName>`."""
        lines = ["Traceback (most recent call last):"]
        tb = _exc_tb(exc)
        while tb is not None and _len(lines) < 60:
            code = tb.tb_frame.f_code
            lines.append('  File "' + text(code.co_filename) + '", line '
                         + _int_repr(tb.tb_lineno) + ", in " + text(code.co_name))
            tb = tb.tb_next
        # what is read of a value goes through the built-in types' own slots and numpy's C
        # descriptors (type checked), so no method of the solution's can run here
        type_dict = _type_type.__dict__
        mro_of, dict_of = type_dict["__mro__"].__get__, type_dict["__dict__"].__get__
        getset, member = _type(type_dict["__dict__"]), _type(type_dict["__dictoffset__"])
        _float, _complex, _tuple = _type(0.0), _type(0j), _type(())
        float_repr, complex_repr = _float.__repr__, _complex.__repr__
        tuple_items, list_items = _tuple.__getitem__, _list.__getitem__

        def name_of(kind) -> str:
            name = _type_name(kind)
            return _str_copy(name)[:60] if is_a(name, _str) else "?"

        def dtype_name(value) -> str | None:
            """A numpy dtype's scalar type name (float64): found through numpy.dtype's own C
            descriptors (`isbuiltin`, `type`) in the value's type's MRO, None if not one."""
            for kind in mro_of(_type(value)):
                module = _type_module(kind)
                if name_of(kind) != "dtype" or not is_a(module, _str) or \
                        _str_copy(module) != "numpy":
                    continue
                found = dict_of(kind)
                builtin, scalar = found.get("isbuiltin"), found.get("type")
                if _type(builtin) is not getset or _type(scalar) is not member:
                    return None
                flag, scalar = builtin.__get__(value, kind), scalar.__get__(value, kind)
                if _type(flag) is _int and flag == 1 and is_a(scalar, _type_type):
                    return name_of(scalar)
                return None
            return None

        def shown(value, depth: int) -> str:
            if value is None or value is True or value is False:
                return "None" if value is None else "True" if value is True else "False"
            if is_a(value, _str) or is_a(value, _bytes):
                return text(value) if depth == 0 else "'" + text(value) + "'"
            if is_a(value, _int):
                return _int_repr(value)
            if is_a(value, _float):
                return float_repr(value)
            if is_a(value, _complex):
                return complex_repr(value)
            if (is_a(value, _tuple) or is_a(value, _list)) and depth < 3:
                tuple_like = is_a(value, _tuple)
                items = (tuple_items if tuple_like else list_items)(value, _slice(0, 17))
                parts = []
                for i, item in _enumerate(items):
                    parts.append("..." if i == 16 else shown(item, depth + 1))
                inner = ", ".join(parts)
                if tuple_like:
                    return "(" + inner + ("," if _len(parts) == 1 else "") + ")"
                return "[" + inner + "]"
            dtype = dtype_name(value)
            if dtype is not None:
                return dtype
            return "<" + name_of(_type(value)) + ">"

        def numpy_memory(args) -> str | None:
            """numpy's own words for an allocation it could not make (its MemoryError keeps
            the shape and the dtype, and words them in a method of its own, not called)."""
            if _len(args) != 2 or not is_a(args[0], _tuple):
                return None
            shape = tuple_items(args[0], _slice(0, 33))
            dtype = dtype_name(args[1])
            if dtype is None or _len(shape) > 32 or _any(_type(x) is not _int for x in shape):
                return None
            bits = "".join(c for c in dtype if "0" <= c <= "9")
            wording = ("Unable to allocate an array with shape " + shown(args[0], 0)
                       + " and data type " + dtype)
            if not bits or _len(bits) > 3:
                return wording
            size = int(bits) // 8 or 1
            for dim in shape:
                size = size * dim
            if size < 0 or size > 1 << 80:
                return wording
            unit = 0
            scaled = size
            while scaled >= 1024 and unit < 6:
                scaled, unit = scaled / 1024, unit + 1
            number = float_repr(round(scaled, 1)) if unit else _int_repr(size)
            return ("Unable to allocate " + number + " " + ("B", "KiB", "MiB", "GiB", "TiB",
                    "PiB", "EiB")[unit] + " for an array with shape " + shown(args[0], 0)
                    + " and data type " + dtype)

        args = _exc_args(exc)
        worded = None
        if is_a(exc, MemoryError) and _type(exc) is not MemoryError:  # numpy's subclass
            try:
                worded = numpy_memory(args)
            except _BaseException:
                worded = None
        if worded is not None:
            lines.append("MemoryError: " + worded)
            return "\n".join(lines)[-limit:]
        parts = []
        for arg in args:
            try:
                parts.append(shown(arg, 0))
            except _BaseException:  # an integer too long to show, a value too deep
                parts.append("<" + name_of(_type(arg)) + ">")
        lines.append(name_of(_type(exc)) + ": " + ", ".join(parts))
        return "\n".join(lines)[-limit:]

    _format_code = format_exception.__code__
    sys.dont_write_bytecode = True  # importlib would write the solution's .pyc next to it
    _create_builtin = _defang(sys.audit)
    if seccomp:  # (it imports ctypes, taken out of sys.modules below)
        _seccomp()
    # an import of these must raise the import event: the harness's modules, ctypes and cffi
    # (numpy imports ctypes; its uses are refused as ctypes.* events in any case) and the
    # blocked private modules (subprocess keeps its _posixsubprocess, defanged)
    native = tuple(m + "." for m in _NATIVE_MODULES) + _NATIVE_MODULES
    for name in [n for n in sys.modules if n.startswith(hidden) or n in _NATIVE_MODULES
                 or n.startswith(native) or blocked(n, None) is not None]:
        del sys.modules[name]
    sys.addaudithook(hook)
    return format_exception


__all__ = ["GUARD_EXIT", "install"]
