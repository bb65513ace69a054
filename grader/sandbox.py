"""A sandbox: a fresh process that holds the learner's definitions and answers in plain data.

The grader never imports or calls learner code. Where a judge needs the learner's functions on
inputs of its own (a rule on hidden cases, a scheduler on a hidden trace, a loop timed from
outside), it starts one of these and talks to it through one typed boundary:

- **In**: a job (one JSON line on stdin): the course cells' imports and constants, the lab's setup
  code, the learner's definitions read as text from the screened notebook (``grader/definitions.py``),
  and the policy. Then requests, one JSON line each: call a function on a list of argument lists, or
  run a lab's harness.
- **Out**: replies on a pipe of their own, one JSON line each, values encoded by
  :func:`grader.answers.encode` and read back by the judge with :mod:`grader.schema`. The learner's
  prints go to a log, which the feedback quotes a line of.

The process is started by :class:`Sandbox` with ``python -c`` on this file's text as the grader read
it before any learner code ran, and ``PYTHONPATH`` on a fresh copy of the course code written from
those same bytes (``code_dir``): a kernel that rewrote the course on disk changes nothing here.

**Ground truth is not an answer.** A check that asks for a rule names the course's implementation of
it (``policy["forbid"]``: ``"utils.measure.flops:bound"``). Before any learner code loads, each such
function's code is swapped for a tripwire (every reference to it, in any module, container or thread,
now calls the tripwire), its source files are removed from ``linecache``, and an audit hook (PEP 578;
a hook cannot be removed once added) refuses to open those files, to start a process, to load ctypes'
memory access, to walk the garbage collector's objects or to connect off this machine. An answer that
reaches the course's implementation on any thread gets an error instead of a value, and the tripwire
says so on the reply pipe. The hook never calls into learner objects: it accepts only ``str``,
``bytes`` and ``int`` arguments.

Written by hand: multiprocessing would pickle objects across (objects must never cross), and no
library sandboxes Python in-process. A container around the whole grading run protects the machine
(docs/grading.md); this protects the verdict.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from grader.names import SANDBOX_MARK

SOURCE = Path(__file__).read_text() if "__file__" in globals() else ""  # this file as the grader read it at import, before any learner code ran
REPLY_LIMIT = 16 * 2**20  # bytes of one reply: a learner's function returning a gigabyte gets an error instead
_PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                   "os.forkpty", "os.startfile", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill")
_INTROSPECTION_EVENTS = ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile",
                         "os.symlink", "os.link", "os.rename", "os.replace", "shutil.copyfile")


class GroundTruthError(RuntimeError):
    """Raised by a tripwire: the answer called the course's implementation of the rule it is asked to write."""


# -- the sandbox's side ---------------------------------------------------------------------------

def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


class _Reply:
    """Writes JSON lines to the result pipe (a raw file descriptor: no Python object to patch)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __call__(self, msg: dict) -> None:
        from grader.answers import encode

        data = (SANDBOX_MARK + json.dumps(encode(msg), separators=(",", ":")) + "\n").encode()
        if len(data) > REPLY_LIMIT:
            data = (SANDBOX_MARK + json.dumps({"id": msg.get("id"), "error": f"the reply was {len(data):,} bytes, "
                                              f"over the {REPLY_LIMIT:,}-byte limit"}) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data):]


def _tripwire(target: str, fd: int):
    """Swap the code of ``module:qualname`` for a tripwire; returns the module's source file, or None."""
    import importlib

    mod_name, _, qual = target.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError:
        return None
    parent, obj = mod, mod
    for part in qual.split("."):
        parent, obj = obj, (vars(obj).get(part) if isinstance(obj, type) else getattr(obj, part, None))
    if obj is None:
        return getattr(mod, "__file__", None)
    prop = obj if isinstance(obj, property) else None
    fn = getattr(prop.fget if prop else obj, "__func__", prop.fget if prop else obj)
    line = (SANDBOX_MARK + json.dumps({"ground_truth": target}) + "\n").encode()
    msg = (f"{mod_name}.{qual} is the course's implementation of the rule this cell asks you to write; "
           "it is not available while your answer is graded")
    src = (f"def {getattr(fn, '__name__', 'tripwire')}(*args, **kwargs):\n"
           f"    __import__('os').write({fd}, {line!r})\n"
           f"    raise __import__('grader.sandbox', fromlist=['GroundTruthError']).GroundTruthError({msg!r})\n")
    scope: dict = {}
    exec(compile(src, f"<tripwire {target}>", "exec"), scope)  # noqa: S102 - the grader's own text
    trip = next(v for v in scope.values() if callable(v))
    if hasattr(fn, "__code__") and not fn.__code__.co_freevars:
        fn.__code__ = trip.__code__  # every reference to it, anywhere, now calls the tripwire
    elif prop is not None:
        setattr(parent, qual.rsplit(".", 1)[-1], property(trip))
    else:  # a builtin or a closure: replace it where its owner holds it
        setattr(parent, qual.rsplit(".", 1)[-1], trip)
    return getattr(mod, "__file__", None)


def _hook(files: tuple[str, ...], stems: tuple[str, ...], modules: frozenset, strict: bool):
    """The audit hook (closure over immutable values only; see the module docstring)."""
    loopback = ("127.0.0.1", "::1", "localhost")
    names = frozenset(f.rsplit("/", 1)[-1] for f in files)

    def refuse(event: str, what: str):
        raise PermissionError(f"{what} is not allowed while your answer is graded ({event})")

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            a = args[0] if args else None
            if type(a) is int:
                return
            if type(a) not in (str, bytes):
                refuse(event, "opening a file through an object")
            p = a if type(a) is str else a.decode(errors="replace")
            if p.endswith(files) or ("__pycache__" in p and any(s in p for s in stems)):
                refuse(event, f"reading {p}")
            if p.rsplit("/", 1)[-1] in names and os.path.realpath(p).endswith(files):
                refuse(event, f"reading {p}")
        elif event == "import" and args and type(args[0]) is str and args[0] in modules:
            raise ImportError(f"{args[0]} is not available while your answer is graded")
        elif strict and event.startswith(_PROCESS_EVENTS):
            if not (event == "os.kill" and args and type(args[0]) is int and args[0] == os.getpid()):
                refuse(event, "starting or signalling another process")
        elif strict and (event.startswith("ctypes.") or event in _INTROSPECTION_EVENTS):
            refuse(event, event)
        elif strict and event == "socket.connect" and len(args) > 1:
            addr = args[1]
            host = addr[0] if type(addr) is tuple and addr and type(addr[0]) is str else None
            if host not in loopback:
                refuse(event, "a connection off this machine")
        elif strict and event == "socket.getaddrinfo" and args and type(args[0]) is str and args[0] not in loopback:
            refuse(event, "a connection off this machine")

    return hook


def _build(value):
    """A request argument: plain JSON, where ``{"__build__": "module:Name", "kwargs": {...}}`` is a
    course object constructed here (``utils`` and ``grader.labs`` only)."""
    import importlib

    if isinstance(value, list):
        return [_build(v) for v in value]
    if isinstance(value, dict) and "__build__" in value:
        mod, _, name = value["__build__"].partition(":")
        if not mod.startswith(("utils.", "grader.labs.")) and mod != "utils":
            raise ValueError(f"cannot build {value['__build__']}")
        obj = importlib.import_module(mod)
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj(*_build(value.get("args", [])), **{k: _build(v) for k, v in value.get("kwargs", {}).items()})
    if isinstance(value, dict) and "__tuple__" in value:
        return tuple(_build(v) for v in value["__tuple__"])
    if isinstance(value, dict):
        return {k: _build(v) for k, v in value.items()}
    return value


class _Timeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _Timeout


class Clock:
    """What a harness uses to be timed from outside: :meth:`go` says it is ready and waits for the
    judge's go (which carries a seed the harness had no way to know before); :meth:`done` hands over
    the outputs the timed work produced. The judge times from sending go to reading done."""

    def __init__(self, rid: int, reply: _Reply):
        self.rid, self.reply = rid, reply

    def go(self, label: str) -> int:
        self.reply({"id": self.rid, "ready": label})
        line = sys.stdin.readline()
        msg = json.loads(line) if line.strip() else {}
        if msg.get("go") != label:
            raise RuntimeError(f"expected the grader's go for {label!r}")
        return int(msg["seed"])

    def done(self, label: str, outputs) -> None:
        self.reply({"id": self.rid, "done": label, "outputs": outputs})


def _run_sources(sources: list, ns: dict, kind: str) -> list[str]:
    """Execute each source (one notebook cell's kept statements), statement by statement, under one
    file name linecache holds; the first line of each failure, by cell."""
    import ast
    import linecache

    errors = []
    for index, src in enumerate(sources):
        name = f"<{kind}-cell-{index}>"
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        for stmt in ast.parse(src).body:
            try:
                exec(compile(ast.Module([stmt], []), name, "exec"), ns)  # noqa: S102
            except BaseException as exc:  # SystemExit included: it stops this statement, not the sandbox
                errors.append(f"{ast.unparse(stmt).splitlines()[0][:80]}: {_first_line(exc)}")
    return errors


def _serve(job: dict) -> None:
    import importlib
    import linecache

    reply = _Reply(int(job["result_fd"]))
    ns: dict = {"__name__": "__main__"}
    setup_errors = _run_sources(job.get("prelude", []), ns, "course")
    for mod in job.get("imports", []):
        importlib.import_module(mod)
    setup_errors += _run_sources([job["setup"]] if job.get("setup") else [], ns, "setup")
    ns.update(job.get("values", {}))
    policy = job.get("policy", {})
    files = [f for f in (_tripwire(t, reply.fd) for t in policy.get("forbid", [])) if f]
    files = tuple(sorted({os.path.realpath(f) for f in files} | set(files)))
    stems = tuple(sorted({f"{os.sep}{Path(f).stem}." for f in files}))
    linecache.clearcache()
    modules = frozenset(t.partition(":")[0] for t in policy.get("forbid", []))
    sys.addaudithook(_hook(files, stems, modules, bool(policy.get("strict", True))))
    loaded = _run_sources(job.get("definitions", []), ns, "yours")
    reply({"id": 0, "setup_errors": setup_errors, "definition_errors": loaded})
    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, _on_alarm)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        rid = req["id"]
        try:
            if req["op"] == "call":
                fn = ns.get(req["function"])
                if fn is None or not callable(fn):
                    reply({"id": rid, "error": f"{req['function']} is not defined by your definitions"})
                    continue
                results = []
                for args in req["args_list"]:
                    signal.alarm(int(req.get("per_call_s", 30)))
                    try:
                        results.append({"ok": fn(*_build(args))})
                    except _Timeout:
                        results.append({"error": f"took over {req.get('per_call_s', 30)} s"})
                    except BaseException as exc:
                        results.append({"error": _first_line(exc)})
                    finally:
                        signal.alarm(0)
                reply({"id": rid, "results": results})
            elif req["op"] == "harness":
                mod, _, name = req["harness"].partition(":")
                harness = getattr(importlib.import_module(mod), name)
                reply({"id": rid, "result": harness(ns, _build(req.get("params", {})), Clock(rid, reply))})
        except BaseException as exc:  # the learner's code raised through the harness, or broke the sandbox
            reply({"id": rid, "error": _first_line(exc)})


def sandbox_main() -> None:
    """Entry point inside the sandbox process (``python -c SOURCE``)."""
    job = json.loads(sys.stdin.readline())
    sys.modules.setdefault("grader.sandbox", sys.modules["__main__"])  # the tripwire's GroundTruthError
    try:
        _serve(job)
    finally:
        sys.stdout.flush()
        os._exit(0)  # no interpreter teardown: nothing of the learner's runs at exit


# -- the grader's side ----------------------------------------------------------------------------

class SandboxError(RuntimeError):
    """The sandbox stopped or did not answer: the message says what happened, with its log's last line."""


@dataclass
class Section:
    """One externally timed part of a harness: seconds from the judge's go to the done, and the outputs."""

    seconds: float
    outputs: object
    seed: int | None = None  # the seed the judge sent with go: the judge recomputes the work from it


@dataclass
class Started:
    setup_errors: list = field(default_factory=list)
    definition_errors: list = field(default_factory=list)


class Sandbox:
    """A running sandbox, from the grader's side. ``job``: :func:`grader.definitions.job`'s prelude and
    definitions, plus ``setup``, ``imports``, ``values`` and ``policy``; ``code_dir``: a fresh copy of the
    course code (``grader.definitions.write_code``); ``log``: where its stdout and stderr go."""

    def __init__(self, job: dict, code_dir: Path, log: Path, *, cwd: Path | None = None, env: dict | None = None,
                 start_timeout_s: float = 120.0, reap: bool = True):
        from grader.processes import descendants

        self.ground_truth: list[str] = []
        self.reap, self._before = reap, descendants()
        self.log = Path(log)
        read_fd, write_fd = os.pipe()
        base = {k: v for k, v in (env if env is not None else os.environ).items()
                if not k.startswith(("JPY", "IPY", "JUPYTER", "PYTHON"))}
        # PYTHONSAFEPATH (3.11+): no working directory on sys.path, so no file written beside it is imported
        base.update(PYTHONPATH=str(code_dir), PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0", PYTHONSAFEPATH="1")
        with open(self.log, "ab") as log_fh:
            self.proc = subprocess.Popen([sys.executable, "-c", SOURCE], cwd=cwd or self.log.parent,
                                         env=base, stdin=subprocess.PIPE, stdout=log_fh, stderr=subprocess.STDOUT,
                                         pass_fds=(write_fd,), start_new_session=True)
        os.close(write_fd)
        self.fd, self.buf, self.next_id = read_fd, b"", 1
        self._send(dict(job, result_fd=write_fd))
        first = self._read(0, start_timeout_s)
        self.started = Started(first.get("setup_errors", []), first.get("definition_errors", []))

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()
        if self.reap:
            from grader.processes import kill_descendants

            kill_descendants(spare=self._before)  # what it started in a session of its own, which a subreaper adopts
        try:
            os.close(self.fd)
        except OSError:
            pass

    def log_tail(self, lines: int = 3) -> str:
        try:
            with open(self.log, "rb") as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - 8192))
                text = fh.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(ln.strip() for ln in text[-lines:] if ln.strip())[:400]

    def _send(self, msg: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise SandboxError(self._stopped()) from None

    def _stopped(self) -> str:
        code = self.proc.poll()
        tail = self.log_tail()
        return (f"the sandbox stopped (exit {code})" if code is not None else "the sandbox stopped answering") + \
            (f"; its last output: {tail}" if tail else "")

    def _read(self, rid: int, timeout_s: float) -> dict:
        """The next reply for request ``rid`` (ground-truth alarms on the way are kept)."""
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\n" not in self.buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxError(f"no answer within {timeout_s:.0f} s"
                                       + (f"; its last output: {t}" if (t := self.log_tail()) else ""))
                ready, _, _ = select.select([self.fd], [], [], min(left, 1.0))
                if ready:
                    chunk = os.read(self.fd, 1 << 20)
                    if not chunk:
                        raise SandboxError(self._stopped())
                    self.buf += chunk
                    if len(self.buf) > REPLY_LIMIT + 1024 and b"\n" not in self.buf:
                        raise SandboxError(f"a reply over {REPLY_LIMIT:,} bytes")
                elif self.proc.poll() is not None and not self.buf:
                    raise SandboxError(self._stopped())
            line, _, self.buf = self.buf.partition(b"\n")
            text = line.decode(errors="replace")
            if not text.startswith(SANDBOX_MARK):
                continue  # bytes someone else wrote to the pipe: not a reply
            try:
                from grader.schema import loads

                msg = loads(text[len(SANDBOX_MARK):])
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            if "ground_truth" in msg and isinstance(msg["ground_truth"], str):
                self.ground_truth.append(msg["ground_truth"])
                continue
            if msg.get("id") == rid:
                return msg

    def call(self, function: str, args_list: list, *, timeout_s: float = 120.0, per_call_s: float = 30.0) -> list[dict]:
        """``function`` (a name the learner's definitions bind) on each argument list: per call
        ``{"ok": value}`` or ``{"error": "..."}``, values as plain JSON data."""
        rid, self.next_id = self.next_id, self.next_id + 1
        self._send({"id": rid, "op": "call", "function": function, "args_list": args_list, "per_call_s": per_call_s})
        msg = self._read(rid, timeout_s)
        if "error" in msg:
            return [{"error": str(msg["error"])}] * len(args_list)
        results = msg.get("results")
        if not isinstance(results, list) or len(results) != len(args_list):
            return [{"error": "the sandbox's reply did not have one result per call"}] * len(args_list)
        return [r if isinstance(r, dict) and ("ok" in r or "error" in r) else {"error": "malformed result"}
                for r in results]

    def harness(self, name: str, params: dict, *, seeds: dict | None = None, timeout_s: float = 600.0) -> tuple:
        """Run the lab harness ``module:function`` on the learner's definitions; returns ``(result,
        {label: Section})``. Each ``clock.go(label)`` gets the judge's go with a fresh seed (``seeds``
        gives them, else random), timed here from sending go to reading ``done``."""
        import secrets

        rid, self.next_id = self.next_id, self.next_id + 1
        self._send({"id": rid, "op": "harness", "harness": name, "params": params})
        sections, deadline = {}, time.monotonic() + timeout_s
        while True:
            msg = self._read(rid, max(1.0, deadline - time.monotonic()))
            if "ready" in msg:
                label = str(msg["ready"])
                seed = (seeds or {}).get(label, secrets.randbits(31))
                t0 = time.perf_counter()
                self._send({"go": label, "seed": seed})
                done = self._read(rid, max(1.0, deadline - time.monotonic()))
                t1 = time.perf_counter()
                if done.get("done") != label:
                    raise SandboxError(str(done.get("error") or f"the harness did not finish {label!r}"))
                sections[label] = Section(t1 - t0, done.get("outputs"), seed)
                continue
            if "error" in msg:
                raise SandboxError(str(msg["error"]))
            return msg.get("result"), sections


if __name__ == "__main__":  # pragma: no cover - started through Sandbox, never by hand
    sandbox_main()
