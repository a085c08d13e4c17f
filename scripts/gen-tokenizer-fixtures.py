#!/usr/bin/env python3
"""Generate the tokenizer reference fixtures in tests/fixtures/tokenizer/ with llama.cpp.

For each of our four models (tests/src/assets.rs) this loads the vocab only (no weights) through
llama-cpp-python's low-level bindings, runs a fixed multilingual corpus and writes:

  <key>.json       encode/decode references: for every sample its text, ids_plain
                   (add_special=False, parse_special=False), ids_special (add_special=True,
                   parse_special=True), detok_plain (llama_detokenize of ids_plain with
                   remove_special=False, unparse_special=False), pieces_plain (the hex bytes of
                   llama_token_to_piece(id, lstrip=0, special=False) per id of ids_plain), and
                   detok_special (llama_detokenize of ids_special, unparse_special=True); plus
                   the vocab's size, BOS/EOS ids and texts, add_bos/add_eos, the end-of-generation
                   ids (llama_vocab_is_eog over every id), and the user-defined tokens that the
                   corpus matched atomically with parse_special=False.
  <key>.chat.json  chat-template renderings of several message lists with add_generation_prompt
                   true and false, by two renderers: "jinja2" (ground truth: llama-cpp-python's
                   Jinja2ChatFormatter, i.e. Python jinja2 with trim_blocks and lstrip_blocks, the
                   HF rendering that llama.cpp's server reproduces with its own Jinja engine) and
                   "llama_chat_apply_template" (llama.cpp's built-in, pattern-detected formats,
                   given the model's template). Models without tokenizer.chat_template get a file
                   that says so.

Model keys: smollm2, qwen05, qwen15, gemma3. Models come from `scripts/fetch-assets.sh models`
(cache: ${LLORCH_ASSETS:-$HOME/.cache/llorch}/models).

Environment (llama-cpp-python 0.3.36 bundles a llama.cpp build; no GPU, no native CPU flags so
the wheel runs on any x86-64 host). Built once into a wheel cache, then installed:

    mkdir -p ~/.cache/llorch/wheels
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \\
    CMAKE_BUILD_PARALLEL_LEVEL=2 \\
        pip wheel --no-deps -w ~/.cache/llorch/wheels llama-cpp-python==0.3.36
    pip install ~/.cache/llorch/wheels/llama_cpp_python-0.3.36-*.whl
    pip install -r scripts/requirements-fixtures.txt

Then:

    python3 scripts/gen-tokenizer-fixtures.py [--models DIR] [--out DIR] [key ...]

The output is deterministic (sorted keys, fixed corpus), so regenerating with the same versions
gives byte-identical files.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import jinja2
import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from llorch_assets import MODELS, fixture_args


# (name, text): names are stable ids the Rust tests can refer to.
CORPUS: list[tuple[str, str]] = [
    ("empty", ""),
    ("space", " "),
    ("two_spaces", "  "),
    ("newline", "\n"),
    ("two_newlines", "\n\n"),
    ("tab", "\t"),
    ("spaces_100", " " * 100),
    ("combining_lone", "\u0301"),
    ("combining_after_e", "e\u0301 a\u0308\u0304"),
    ("hello", "Hello world"),
    ("hello_leading_space", " Hello world"),
    ("sentence", "Hello, world! How are you? I'm fine; they've said \"no\" (twice)."),
    ("contractions", "I'm you're it's we'll they've I'd don't 'quoted' OK'S"),
    ("numbers", "1234567890 3.14159"),
    ("numbers_long", "12345678901234567890 3,000,000.50 -42 0x1F 1e-9"),
    (
        "code_python",
        "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    ),
    ("code_rust_tabs", 'fn main() {\n\tlet v = vec![1, 2];\n\tprintln!("{v:?}");\n}\n'),
    ("markdown", "# Title\n\n- item 1\n- item 2\n\n```python\nprint('x')\n```\n"),
    ("whitespace_mix", "a  b   c\t\td\n \n  e\r\nf \t \n\n\n g   "),
    ("leading_ws", "   \n\n\t  x"),
    ("chinese", "你好，世界！今天天气很好。"),
    ("japanese", "こんにちは、世界。カタカナとひらがな、漢字。"),
    ("korean", "안녕하세요, 세계! 반갑습니다."),
    ("emoji", "👍 👍🏽 👩‍👩‍👧‍👦 🏳️‍🌈 🦀🦀 😀!"),
    ("arabic", "مرحبا بالعالم، كيف حالك؟"),
    ("hebrew", "שלום עולם"),
    ("hindi", "नमस्ते दुनिया, आप कैसे हैं?"),
    ("russian", "Привет, мир! Как дела?"),
    ("thai", "สวัสดีชาวโลก"),
    ("accents", "Ünïcödé café naïve façade Ærøskøbing"),
    ("mixed_script", "Hello 世界 мир عالم 🌍! def f(x): return x²"),
    ("punctuation", "https://example.com/path?q=1&x=%20 — “quotes” ‘single’ … «guillemets»"),
    ("zero_width", "a\u200bb\ufeffc\u200dd"),
    # Rare scripts and planes: byte-fallback tokens in gemma's SentencePiece vocab.
    ("rare_codepoints", "𓀀𓀁 𐀀 \U0001D518 \U00020000 \uE000 \U0010FFFD ꙮ ᚠᛇᚻ"),
    ("repeats", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa !!!!!!!!??? ........"),
    ("chatml_tokens", "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"),
    ("gemma_tokens", "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"),
    ("endoftext_inline", "text <|endoftext|> more"),
    ("bos_eos_strings", "<s> </s> <bos> <eos> <pad> <unk>"),
    ("special_adjacent", "x<|im_start|><|im_end|>y<end_of_turn>z"),
]

# Message lists for the chat fixtures.
CONVERSATIONS: list[tuple[str, list[dict[str, str]]]] = [
    ("single_user", [{"role": "user", "content": "Hello!"}]),
    (
        "system_user",
        [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "What is 2+2?"},
        ],
    ),
    (
        "multi_turn",
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Write a haiku about Rust."},
            {"role": "assistant", "content": "Borrow checker sighs\nlifetimes bend but never break\nsafe code, fearless threads"},
            {"role": "user", "content": "Now one about C."},
        ],
    ),
    (
        "multi_turn_no_system",
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a joke."},
        ],
    ),
    (
        "unicode_whitespace",
        [{"role": "user", "content": "  Spaces  \n\tand 中文 🦀 مرحبا\n\n"}],
    ),
]


class Vocab:
    """A vocab-only llama.cpp model and the calls the fixtures need."""

    def __init__(self, path: Path):
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def close(self) -> None:
        llama_cpp.llama_model_free(self.model)

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode()
        n_max = len(data) + 16
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            raise RuntimeError(f"tokenize: buffer of {n_max} too small ({-n})")
        return list(buf[:n])

    def detokenize(self, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
        arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
        size = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), buf, size, remove_special, unparse_special)
        if n < 0:
            raise RuntimeError(f"detokenize: buffer of {size} too small ({-n})")
        return buf.raw[:n]

    def piece(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 256, 0, special)
        if n < 0:
            raise RuntimeError(f"token_to_piece({token}): needs {-n} bytes")
        return buf.raw[:n]

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 20)
        n = llama_cpp.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return None if n < 0 else buf.raw[:n].decode()

    def attr(self, token: int) -> int:
        return int(llama_cpp.llama_vocab_get_attr(self.vocab, token))

    def token_or_none(self, token: int) -> int | None:
        return None if token == llama_cpp.LLAMA_TOKEN_NULL else int(token)


def utf8(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SystemExit(f"{what}: llama.cpp produced invalid UTF-8 {data!r}: {err}")


def encode_fixture(key: str, v: Vocab) -> dict:
    bos = v.token_or_none(llama_cpp.llama_vocab_bos(v.vocab))
    eos = v.token_or_none(llama_cpp.llama_vocab_eos(v.vocab))
    user_defined = llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
    samples = []
    atomic_user_defined: set[str] = set()
    for name, text in CORPUS:
        ids_plain = v.tokenize(text, add_special=False, parse_special=False)
        ids_special = v.tokenize(text, add_special=True, parse_special=True)
        for t in ids_plain:
            if v.attr(t) & user_defined:
                atomic_user_defined.add(utf8(v.piece(t, True), f"{key}/{name} piece {t}"))
        samples.append(
            {
                "name": name,
                "text": text,
                "ids_plain": ids_plain,
                "ids_special": ids_special,
                "detok_plain": utf8(v.detokenize(ids_plain, False, False), f"{key}/{name}"),
                "detok_special": utf8(v.detokenize(ids_special, False, True), f"{key}/{name}"),
                "pieces_plain": [v.piece(t, False).hex() for t in ids_plain],
            }
        )
    eog = [t for t in range(v.n_vocab) if llama_cpp.llama_vocab_is_eog(v.vocab, t)]
    return {
        "generator": "scripts/gen-tokenizer-fixtures.py",
        "llama_cpp_python": llama_cpp.__version__,
        "model": MODELS[key],
        "tokenizer_model": v.meta("tokenizer.ggml.model"),
        "tokenizer_pre": v.meta("tokenizer.ggml.pre"),
        "n_vocab": v.n_vocab,
        "bos_id": bos,
        "eos_id": eos,
        "bos_text": None if bos is None else utf8(v.piece(bos, True), "bos"),
        "eos_text": None if eos is None else utf8(v.piece(eos, True), "eos"),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(v.vocab)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(v.vocab)),
        "eog_ids": eog,
        "user_defined_matched_with_parse_special_false": sorted(atomic_user_defined),
        "samples": samples,
    }


def builtin_render(template: str, messages: list[dict[str, str]], add_ass: bool) -> str | None:
    """llama.cpp's llama_chat_apply_template (built-in formats detected from the template)."""
    msgs = (llama_cpp.llama_chat_message * len(messages))()
    keep = []  # the encoded strings must outlive the call
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        msgs[i].role = role
        msgs[i].content = content
    size = 1 << 16
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(template.encode(), msgs, len(messages), add_ass, buf, size)
    if n < 0:
        return None  # template not recognised by the built-in detector
    return buf.raw[:n].decode()


def chat_fixture(key: str, v: Vocab, enc: dict) -> dict:
    template = v.meta("tokenizer.chat_template")
    out: dict = {
        "generator": "scripts/gen-tokenizer-fixtures.py",
        "llama_cpp_python": llama_cpp.__version__,
        "jinja2": jinja2.__version__,
        "model": MODELS[key],
        "has_template": template is not None,
        "ground_truth": "jinja2",
        "renderers": {
            "jinja2": "llama_cpp.llama_chat_format.Jinja2ChatFormatter (Python jinja2, "
            "trim_blocks, lstrip_blocks; messages, add_generation_prompt, bos_token, eos_token, "
            "raise_exception, strftime_now, tools=None)",
            "llama_chat_apply_template": "llama.cpp built-in format detected from the template",
        },
        "bos_token": enc["bos_text"] or "",
        "eos_token": enc["eos_text"] or "",
        "cases": [],
    }
    if template is None:
        return out
    out["template"] = template
    for name, messages in CONVERSATIONS:
        for add_gen in (True, False):
            formatter = Jinja2ChatFormatter(
                template=template,
                eos_token=out["eos_token"],
                bos_token=out["bos_token"],
                add_generation_prompt=add_gen,
            )
            rendered = formatter(messages=[dict(m) for m in messages]).prompt
            out["cases"].append(
                {
                    "name": name,
                    "add_generation_prompt": add_gen,
                    "messages": messages,
                    "jinja2": rendered,
                    "llama_chat_apply_template": builtin_render(template, messages, add_gen),
                }
            )
    return out


def write_json(path: Path, value: dict) -> None:
    text = json.dumps(value, ensure_ascii=False, indent=1, sort_keys=True) + "\n"
    path.write_text(text, encoding="utf-8")
    print(f"{path}: {len(text.encode())} bytes", file=sys.stderr)


# Kept at module level: llama.cpp calls it for the life of the process.
_QUIET = llama_cpp.llama_log_callback(lambda *_: None)


def main() -> None:
    args = fixture_args(__doc__.split("\n\n")[0], "tokenizer")

    llama_cpp.llama_log_set(_QUIET, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    args.out.mkdir(parents=True, exist_ok=True)
    for key in args.keys:
        path = args.models / MODELS[key]
        if not path.exists():
            raise SystemExit(f"{path} is missing; run scripts/fetch-assets.sh {key}")
        v = Vocab(path)
        try:
            enc = encode_fixture(key, v)
            write_json(args.out / f"{key}.json", enc)
            write_json(args.out / f"{key}.chat.json", chat_fixture(key, v, enc))
        finally:
            v.close()


if __name__ == "__main__":
    main()
