"""Chat templates rendered in a child process, bounded in time, memory and output (design record 0043). A template
comes with a model from a stranger, and Jinja's sandbox bounds what a template may touch, not what it may cost: a
nested loop runs for hours, a string doubled in a loop or a filter's width of 10**9 allocates gigabytes, all
within the sandbox, some of it inside one C call no Python-level check can interrupt. So each render runs in a
child whose address space is capped (RLIMIT_AS at MAX_MEMORY), whose output is counted as it is produced (past
MAX_OUTPUT characters, or twice the request's own size where that is more, the render stops), and whose answer the
parent waits for at most TIMEOUT_S. A render past a bound is a TemplateLimit naming it, and the child is replaced
(killed and reaped; the next render starts a new one).

    python -m gptport.serve.api.template_worker      the child: JSON lines on stdin, JSON lines on stdout

The child reads {"sources": {name: text}, "max_memory", "max_output", "timeout"} once (answering {"ready": true}
or {"error", "message"}), then {"name", "context"} per render, and answers {"text"} or
{"error": "template" | "limit", "message"}. Lines are ASCII (JSON's escapes). It exits when its stdin closes (the
server stopped or the worker was collected), and, should its parent die mid-render, at its CPU-time limit
(RLIMIT_CPU, raised before each render to the time used + TIMEOUT_S + 2 s). No torch here.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import threading
import weakref
from typing import IO, Any

TIMEOUT_S = 2.0  # a render's wall-clock bound (a real template renders in ~0.05 ms)
MAX_OUTPUT = 2**20  # characters of rendered prompt (1 Mi, past the 1 MiB request body serve takes by default) ...
OUTPUT_PER_REQUEST = 2  # ... or this many times the characters of the request sent to the child, if more
MAX_MEMORY = 2**29  # bytes of the child's address space (512 MiB; Python and Jinja take ~30 MB of it)
STARTUP_S = 30.0  # the child's first answer (Python's start, Jinja's import, the compile) on a loaded machine
# what a template's own expressions raise ({{ 1 / 0 }}, {{ x.y }} on a string, int('a')): its refusal, not a crash
TEMPLATE_FAULTS = (ArithmeticError, AttributeError, LookupError, RuntimeError, TypeError, ValueError)


class TemplateRefused(Exception):
    """The template raised (raise_exception, an undefined name, a sandbox violation, a failing expression)."""


class TemplateLimit(Exception):
    """The render passed a bound (time, memory, output, recursion): which, and its value, in words."""


def _render(template: Any, context: dict[str, Any], max_output: int, max_memory: int) -> dict[str, Any]:
    """One render in the child, its output counted as it is produced."""
    from jinja2 import TemplateError

    parts, size = [], 0
    try:
        for piece in template.generate(**context):
            size += len(piece)
            if size > max_output:
                return {"error": "limit", "message": f"its output passed {max_output:,} characters"}
            parts.append(piece)
    except MemoryError:
        return {"error": "limit", "message": f"it needed more than {_mib(max_memory)} of memory"}
    except RecursionError:
        return {"error": "limit", "message": f"it recursed past Python's limit ({sys.getrecursionlimit():,} frames)"}
    except OverflowError as e:  # the sandbox's range() bound among them
        return {"error": "limit", "message": f"a value overflowed ({e})"}
    except TemplateError as e:
        return {"error": "template", "message": str(e)}
    except TEMPLATE_FAULTS as e:
        return {"error": "template", "message": f"{type(e).__name__}: {e}"}
    return {"text": "".join(parts)}


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _limit(kind: int, soft: int) -> None:
    import resource

    hard = resource.getrlimit(kind)[1]
    resource.setrlimit(kind, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def main() -> None:
    """The child's loop."""
    import resource

    from jinja2 import TemplateError

    from gptport.serve.api.chat_env import environment

    env = environment()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    opening = stdin.readline()
    if not opening:  # the parent went before asking anything
        return
    first = json.loads(opening)
    memory, output, timeout = int(first["max_memory"]), int(first["max_output"]), float(first["timeout"])
    _limit(resource.RLIMIT_AS, memory)
    _limit(resource.RLIMIT_CORE, 0)  # a child killed at its CPU limit leaves no core file
    try:
        templates = {name: env.from_string(text) for name, text in first.get("sources", {}).items()}
        answer: dict[str, Any] = {"ready": True}
    except (TemplateError, RecursionError, MemoryError) as e:
        templates, answer = {}, {"error": "template", "message": f"{type(e).__name__}: {e}"}
    _answer(stdout, answer)
    for line in stdin:
        request = json.loads(line)
        used = resource.getrusage(resource.RUSAGE_SELF)
        _limit(resource.RLIMIT_CPU, int(used.ru_utime + used.ru_stime + timeout) + 2)
        bound = max(output, OUTPUT_PER_REQUEST * len(line))
        _answer(stdout, _render(templates[request["name"]], request["context"], bound, memory))


def _answer(stdout: IO[bytes], answer: dict[str, Any]) -> None:
    stdout.write(json.dumps(answer).encode("ascii") + b"\n")
    stdout.flush()


class TemplateWorker:
    """The parent's side: one child for one model's templates, started on the first render and again after one
    was stopped; renders one at a time. The child is stopped when the worker is collected or the server exits."""

    def __init__(self, sources: dict[str, str], timeout: float = TIMEOUT_S, max_memory: int = MAX_MEMORY,
                 max_output: int = MAX_OUTPUT) -> None:
        self.sources, self.timeout, self.max_memory, self.max_output = sources, timeout, max_memory, max_output
        self.lock = threading.Lock()
        self._child: list[subprocess.Popen[bytes]] = []  # the running child, if any (shared with the finalizer)
        weakref.finalize(self, _stop, self._child)

    def render(self, name: str, context: dict[str, Any]) -> str:
        """Template `name` rendered with `context` (JSON values), or TemplateRefused / TemplateLimit."""
        line = json.dumps({"name": name, "context": context})
        with self.lock:
            answer = self._ask(self._started(), line, self.timeout)
            if "error" in answer and answer["error"] != "template":
                _stop(self._child)  # a child that ran out of memory or recursion is not trusted again
        if "text" in answer:
            return str(answer["text"])
        if answer["error"] == "template":
            raise TemplateRefused(answer["message"])
        raise TemplateLimit(answer["message"])

    def close(self) -> None:
        """Stop the child (a render in progress is lost); the next render starts another."""
        with self.lock:
            _stop(self._child)

    def pid(self) -> int | None:
        """The running child's process id, if one runs."""
        return self._child[0].pid if self._child else None

    def _started(self) -> subprocess.Popen[bytes]:
        if self._child and self._child[0].poll() is None:
            return self._child[0]
        _stop(self._child)
        proc = subprocess.Popen([sys.executable, "-m", "gptport.serve.api.template_worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True)  # a Ctrl-C meant for the server does not reach it
        self._child.append(proc)
        answer = self._ask(proc, json.dumps({"sources": self.sources, "max_memory": self.max_memory,
                                             "max_output": self.max_output, "timeout": self.timeout}), STARTUP_S)
        if answer.get("error"):
            _stop(self._child)
            raise TemplateRefused(answer["message"])
        return proc

    def _ask(self, proc: subprocess.Popen[bytes], line: str, timeout: float) -> dict[str, Any]:
        """Send one request line and wait for its answer; past `timeout`, or when the child dies (at its memory
        cap), the child is stopped and the render refused."""
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(line.encode("ascii") + b"\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], timeout)
            answer = proc.stdout.readline() if ready else b""
        except OSError:  # BrokenPipeError: it had died
            answer = b""
        if answer.endswith(b"\n"):
            return dict(json.loads(answer))
        timed_out = proc.poll() is None
        _stop(self._child)
        if timed_out:
            raise TemplateLimit(f"it took longer than {timeout:g} s")
        raise TemplateLimit(f"it ended its render process (exit status {proc.returncode}; its memory is bounded at "
                            f"{_mib(self.max_memory)})")


def _stop(child: list[subprocess.Popen[bytes]]) -> None:
    """Kill and reap the child in `child`, if any, and close its pipes."""
    while child:
        proc = child.pop()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


if __name__ == "__main__":
    main()
