"""Stand-in for the `utils` module of llama.cpp's server test suite (tools/server/tests/utils.py),
so that the suite's tests start llorch-cpud instead of llama-server.

scripts/llama-server-suite.py copies the suite's own utils.py beside this file as `llama_utils.py`
and this file over `utils.py`; the tests' `from utils import *` then get everything of the
original (ServerResponse, ServerError, match_regex, parallel_function_calls, the presets, …) with
ServerProcess replaced:

- `start()` runs the worker of LLORCH_SUITE_BINARY on the model of LLORCH_SUITE_MODEL, whatever
  model the test names (a hub repo, a file, a URL: nothing is downloaded), with `--port 0`; the
  port comes from the worker's JSON `startup` log line and replaces `server_port`, so every URL
  the test builds afterwards reaches the worker. The options llama-server has are mapped where
  the worker has one with the same meaning (MAPPED), left aside where they change nothing a test
  can observe of an OpenAI-compatible server (IGNORED), and refused otherwise (the test fails
  with the option's name: such a test is to be listed as not applicable in the runner).
- `make_url()` sends llama-server's un-prefixed aliases of OpenAI's routes (`/chat/completions`,
  `/models`, `/responses`, …) to their `/v1` paths, where the worker serves them. `/completions`
  is llama-server's own completion format, not OpenAI's, and is left as it is.
- A generation request the harness sends (make_request, make_stream_request) without `seed` or
  `temperature` gets the server's (`--seed`, `--temp`: 42 and 0.8 unless the test sets others),
  as llama-server gives it its defaults: the worker has no server-wide sampling defaults (a
  request's are OpenAI's, temperature 1 and a fresh seed), and the tests' answers are then
  reproducible. Requests a test sends with the `openai` SDK go as they are.
- `make_any_request()` is the suite's stream assembler, which asserts two things of llama-server's
  own: its `timings` field on the usage chunk, and a first chunk whose `delta.content` is null or
  non-empty. The worker sends OpenAI's first chunk, `{"role": "assistant", "content": ""}`
  (specs/OPENAI.md), and no `timings`; the stand-in reads that first chunk's `""` as null and
  marks the usage chunk, so those two assertions pass and everything else is checked as the
  original checks it.
- `ServerPreset.load_all()` (the session's model download) does nothing.

Standard library and the suite's pinned packages only.
"""

import json
import os
import subprocess
import threading
import time
from collections import deque

import llama_utils as _upstream
from llama_utils import *  # noqa: F401,F403 (the tests take every name of the original)
from llama_utils import DEFAULT_HTTP_TIMEOUT, server_instances

LlamaServerProcess = _upstream.ServerProcess  # the original, whose defaults the options leave

BINARY = os.environ.get("LLORCH_SUITE_BINARY")
MODEL = os.environ.get("LLORCH_SUITE_MODEL")
LOG_DIR = os.environ.get("LLORCH_SUITE_LOGS")

# llama-server's un-prefixed aliases of OpenAI's routes (server.cpp), served under /v1 by us.
V1_ALIASES = {
    "/chat/completions": "/v1/chat/completions",
    "/chat/completions/input_tokens": "/v1/chat/completions/input_tokens",
    "/models": "/v1/models",
    "/responses": "/v1/responses",
    "/responses/input_tokens": "/v1/responses/input_tokens",
    "/embeddings": "/v1/embeddings",
    "/v1/health": "/health",
}

# Routes whose requests get the server's sampling defaults (after V1_ALIASES).
GENERATION = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"}

# Options with a counterpart (see start()).
MAPPED = {"n_ctx", "n_slots", "n_predict", "n_threads", "api_key", "server_host", "server_port"}

# Options that change nothing an OpenAI client can observe, or that the worker does its own way.
IGNORED = {
    "model_hf_repo": "the worker serves LLORCH_SUITE_MODEL",
    "model_hf_file": "the worker serves LLORCH_SUITE_MODEL",
    "model_file": "the worker serves LLORCH_SUITE_MODEL",
    "model_url": "the worker serves LLORCH_SUITE_MODEL",
    "model_alias": "the model id is the GGUF's general.name",
    "offline": "nothing is downloaded",
    "temperature": "no server-wide sampling defaults: a request's are OpenAI's",
    "seed": "no server-wide seed: a request without one draws its own",
    "jinja": "the GGUF's chat template is always rendered by the worker's Jinja engine",
    "debug": "llama-server's --verbose; the worker logs JSON lines to LLORCH_SUITE_LOGS",
    "n_gpu_layer": "a CPU worker",
    "n_batch": "llama.cpp's logical batch; the worker's step (--batch-tokens, 256 at least) "
               "keeps its default",
    "n_ubatch": "llama.cpp's physical batch",
    "server_continuous_batching": "the worker always batches running jobs",
    "fa": "llama.cpp's flash-attention switch",
    "kv_unified": "llama.cpp's KV layout; the worker's KV pool is paged",
    "no_ui": "the worker has no web UI",
    "cache_prompt": "the prefix cache is always on",
    "server_slots": None,  # only False (llama-server's --no-slots) is ignored; True is refused
}


class ServerProcess(LlamaServerProcess):
    """llama.cpp's ServerProcess, starting llorch-cpud."""

    def __init__(self):
        super().__init__()
        self.server_port = 0  # the worker picks a free port and logs it
        self._tail = deque(maxlen=200)
        self._assembling = False

    def _options(self):
        """The options this test set away from upstream's defaults, as {name: value}."""
        changed = {}
        for name, default in vars(LlamaServerProcess).items():
            if name.startswith("_") or callable(default) or isinstance(default, staticmethod):
                continue
            if name in ("process", "server_port", "server_host", "external_server"):
                continue
            value = getattr(self, name)
            if value != default and not (value in (None, False, 0) and default in (None, False, 0)):
                changed[name] = value
        return changed

    def worker_args(self):
        """The worker's command line for this test's options; raises for options it lacks."""
        if not BINARY or not MODEL:
            raise RuntimeError("LLORCH_SUITE_BINARY and LLORCH_SUITE_MODEL must be set "
                               "(scripts/llama-server-suite.py sets them)")
        if "," in self.server_host:
            raise RuntimeError(f"llama-server option --host {self.server_host}: the worker listens "
                               "on one address")
        args = [BINARY, "--model", MODEL, "--host", self.server_host, "--port", "0",
                "--log-format", "json", "--shutdown-grace-sec", "1"]
        refused = []
        for name, value in sorted(self._options().items()):
            if name in MAPPED:
                continue
            if name == "server_slots":
                refused.append("--slots (llama-server's /slots monitor)")
            elif name not in IGNORED:
                refused.append(f"{name}={value!r}")
        if refused:
            raise RuntimeError("llama-server option(s) with no counterpart in llorch-cpud: "
                               + ", ".join(refused))
        slots = self.n_slots or 1
        if self.n_ctx:
            # llama-server's -c is shared by its -np slots; the worker's --ctx-size is one job's.
            args += ["--ctx-size", str(self.n_ctx // slots)]
        if self.n_slots:
            args += ["--parallel", str(self.n_slots)]
        if self.n_predict and self.n_predict > 0:
            args += ["--max-tokens-out", str(self.n_predict)]
        if self.n_threads:
            args += ["--threads", str(self.n_threads)]
        return args

    def start(self, timeout_seconds: int = DEFAULT_HTTP_TIMEOUT) -> None:
        args = self.worker_args()
        # The worker reads LLORCH_* as its flags: none of the caller's leak into it.
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLORCH_")}
        if self.api_key:
            env["LLORCH_API_KEY"] = self.api_key  # not on the command line (ps)
        print(f"tests: starting llorch-cpud with: {' '.join(args)}")
        log = None
        if LOG_DIR:
            os.makedirs(LOG_DIR, exist_ok=True)
            test = os.environ.get("PYTEST_CURRENT_TEST", "session").rsplit(" ", 1)[0]
            safe = "".join(c if c.isalnum() or c in "-_.[]" else "_" for c in test)[:180]
            log = open(os.path.join(LOG_DIR, safe + ".log"), "a", encoding="utf-8")
        self._log_file = log
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, text=True,
                                        errors="replace")
        server_instances.add(self)
        started = threading.Event()

        def drain(proc):
            for line in proc.stdout:
                self._tail.append(line.rstrip("\n"))
                if log is not None:
                    log.write(line)
                if not started.is_set() and line.startswith("{"):
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(record, dict) and record.get("event") == "startup":
                        self.server_port = int(record["port"])
                        started.set()
            started.set()

        self._drain = threading.Thread(target=drain, args=(self.process,), daemon=True)
        self._drain.start()
        deadline = time.time() + timeout_seconds
        if not started.wait(timeout_seconds) or not self.server_port:
            raise RuntimeError("llorch-cpud did not log its startup line:\n"
                               + "\n".join(self._tail))
        while time.time() < deadline:
            try:
                if self.make_request("GET", "/health", timeout=5).status_code == 200:
                    self.ready = True
                    return
            except Exception:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"llorch-cpud exited with {self.process.returncode}:\n"
                                   + "\n".join(self._tail))
            time.sleep(0.05)
        raise TimeoutError(f"llorch-cpud was not ready within {timeout_seconds} s")

    def stop(self) -> None:
        super().stop()
        if getattr(self, "_drain", None) is not None:
            self._drain.join(timeout=5)
            self._drain = None
        if getattr(self, "_log_file", None) is not None:
            self._log_file.close()
            self._log_file = None

    def make_url(self, path: str, host: str | None = None) -> str:
        route, sep, query = path.partition("?")
        return super().make_url(V1_ALIASES.get(route, route) + sep + query, host)

    def with_defaults(self, path: str, data):
        """`data` with the server's `seed` and `temperature` where a generation request has none."""
        if not isinstance(data, dict) or V1_ALIASES.get(path, path) not in GENERATION:
            return data
        defaults = {"seed": self.seed, "temperature": self.temperature}
        return {**{k: v for k, v in defaults.items() if v is not None}, **data}

    def make_request(self, method, path, data=None, *args, **kwargs):
        if method == "POST":
            data = self.with_defaults(path, data)
        return super().make_request(method, path, data, *args, **kwargs)

    def make_stream_request(self, method, path, data=None, *args, **kwargs):
        if method == "POST":
            data = self.with_defaults(path, data)
        for chunk in super().make_stream_request(method, path, data, *args, **kwargs):
            if self._assembling and isinstance(chunk, dict):
                chunk = assembled(chunk)
            yield chunk

    def make_any_request(self, *args, **kwargs):
        self._assembling = True
        try:
            return super().make_any_request(*args, **kwargs)
        finally:
            self._assembling = False


def assembled(chunk: dict) -> dict:
    """A chat chunk as llama-server's assembler expects it (see the module's doc)."""
    choices = chunk.get("choices")
    if not choices:
        if "usage" in chunk and "timings" not in chunk:
            return {**chunk, "timings": "(llama-server's own field; not served)"}
        return chunk
    delta = choices[0].get("delta") or {}
    if "role" in delta and delta.get("content") == "":
        first = {**choices[0], "delta": {**delta, "content": None}}
        return {**chunk, "choices": [first, *choices[1:]]}
    return chunk


_upstream.ServerProcess = ServerProcess  # the presets build ours
ServerPreset.load_all = staticmethod(lambda: None)  # noqa: F405 (nothing to download)
