"""Chat templates rendered in a child process, bounded in time, memory and output (design record 0045). A template
comes with a model from a stranger, and Jinja's sandbox bounds what a template may touch, not what it may cost: a
nested loop runs for hours, a string doubled in a loop or a filter's width of 10**9 allocates gigabytes, all
within the sandbox. In a child whose address space is capped (RLIMIT_AS), with the parent waiting at most
TIMEOUT_S for each answer and the output cut at MAX_OUTPUT characters, every such template is a refusal: the
child is killed (a new one starts on the next render) and the request gets its 400.

    python -m gptport.serve.template_worker      the child: JSON lines on stdin, JSON lines on stdout

The child reads {"sources": {name: template text}} once, then {"name", "context"} per render, and answers
{"text"} or {"error": "template" | "limit", "message"}. It exits when its stdin closes (the server stopped). No
torch here.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import threading
from typing import Any

TIMEOUT_S = 2.0  # a render's wall-clock bound (real templates take well under a millisecond)
MAX_OUTPUT = 4 * 2**20  # characters of rendered prompt (4 Mi: past any context gptport serves, ~1 M tokens)
MAX_MEMORY = 2 * 2**30  # bytes of the child's address space
STARTUP_S = 30.0  # the child's first answer (Python's start and Jinja's import) on a loaded machine


class TemplateRefused(Exception):
    """The template raised (raise_exception, an undefined name, a sandbox violation): its message."""


class TemplateLimit(Exception):
    """The render passed a bound (time, memory, output, recursion): which, in words."""


def _render(templates: dict[str, Any], name: str, context: dict[str, Any]) -> dict[str, Any]:
    """One render in the child, its output counted as it is produced."""
    from jinja2 import TemplateError

    parts, size = [], 0
    try:
        for piece in templates[name].generate(**context):
            size += len(piece)
            if size > MAX_OUTPUT:
                return {"error": "limit", "message": f"its output passed {MAX_OUTPUT:,} characters"}
            parts.append(piece)
    except TemplateError as e:
        return {"error": "template", "message": str(e)}
    except RecursionError:
        return {"error": "limit", "message": "it recursed past Python's recursion limit"}
    except MemoryError:
        return {"error": "limit", "message": f"it needed more than {MAX_MEMORY // 2**20:,} MiB"}
    except OverflowError as e:
        return {"error": "limit", "message": f"a number overflowed ({e})"}
    return {"text": "".join(parts)}


def main() -> None:
    """The child's loop."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MAX_MEMORY, MAX_MEMORY))
    except (ImportError, ValueError, OSError):  # no such limit here (not Linux): the time bound still holds
        pass
    from gptport.serve.chat_env import environment

    env = environment()
    templates: dict[str, Any] = {}
    for line in sys.stdin:
        request = json.loads(line)
        if "sources" in request:
            templates = {name: env.from_string(text) for name, text in request["sources"].items()}
            answer: dict[str, Any] = {"ready": True}
        else:
            answer = _render(templates, request["name"], request["context"])
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


class TemplateWorker:
    """The parent's side: one child for one model's templates, started on the first render and again after
    one was killed; renders one at a time."""

    def __init__(self, sources: dict[str, str], timeout: float = TIMEOUT_S) -> None:
        self.sources, self.timeout = sources, timeout
        self.proc: subprocess.Popen[str] | None = None
        self.lock = threading.Lock()

    def render(self, name: str, context: dict[str, Any]) -> str:
        """Template `name` rendered with `context` (JSON values), or TemplateRefused / TemplateLimit."""
        with self.lock:
            proc = self._started()
            answer = self._ask(proc, {"name": name, "context": context}, self.timeout)
        if "text" in answer:
            return str(answer["text"])
        if answer.get("error") == "template":
            raise TemplateRefused(answer.get("message", ""))
        with self.lock:
            self.close()  # a child that ran out of memory or recursion is not trusted again: the next render starts one
        raise TemplateLimit(answer.get("message", "it failed"))

    def _started(self) -> subprocess.Popen[str]:
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        self.proc = subprocess.Popen([sys.executable, "-m", "gptport.serve.template_worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self._ask(self.proc, {"sources": self.sources}, STARTUP_S)
        return self.proc

    def _ask(self, proc: subprocess.Popen[str], request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request and wait for its answer; past `timeout`, or when the child dies (its memory cap
        reached), it is killed and the render refused."""
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], timeout)
            line = proc.stdout.readline() if ready else ""
        except (BrokenPipeError, OSError):
            line = ""
        if line:
            return dict(json.loads(line))
        timed_out = proc.poll() is None
        self.close()
        if timed_out:
            raise TemplateLimit(f"it took longer than {timeout:g} s")
        raise TemplateLimit(f"it needed more than {MAX_MEMORY // 2**20:,} MiB")

    def close(self) -> None:
        """Stop the child (a render in progress is lost)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()


if __name__ == "__main__":
    main()
