#!/usr/bin/env python3
"""Writes the checked-in seeds of the tokenizer, chat_template and request targets into
corpus-seed/<target>/ (among them the templates that grow a value past any memory, which the
renderer process's heap cap stops).
Real chat templates are read from the SmolLM2 and Qwen2.5-Coder-0.5B GGUFs of the asset cache.
Run from fuzz/ (seed-corpus.sh does)."""
import os, random, struct, sys

ASSETS = os.environ.get('LLORCH_ASSETS', os.path.expanduser('~/.cache/llorch')) + '/models/'

def chat_template(path):
    """tokenizer.chat_template of a GGUF file (v2/v3), read without any GGUF library."""
    sizes = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}
    with open(path, 'rb') as f:
        def rd(fmt):
            return struct.unpack('<' + fmt, f.read(struct.calcsize('<' + fmt)))
        def rstr():
            (n,) = rd('Q')
            return f.read(n)
        def skip(t):
            if t == 8:
                rstr()
            elif t == 9:
                (it, n) = rd('IQ')
                if it in sizes:
                    f.seek(n * struct.calcsize('<' + sizes[it]), 1)
                else:
                    for _ in range(n):
                        skip(it)
            else:
                rd(sizes[t])
        f.read(4); rd('I'); (_, nkv) = rd('QQ')
        for _ in range(nkv):
            key = rstr().decode(); (t,) = rd('I')
            if key == 'tokenizer.chat_template' and t == 8:
                return rstr()
            skip(t)
    sys.exit(f'{path} has no chat template')

def write(target, name, data):
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, name), 'wb') as f:
        f.write(data)

# chat_template: a flags byte, then the template.
T = {}
T['smollm2'] = chat_template(ASSETS + 'SmolLM2-135M-Instruct.Q4_1.gguf')
T['qwen25'] = chat_template(ASSETS + 'qwen2.5-coder-0.5b-instruct-q4_k_m.gguf')
T['gemma'] = b"""{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first_user_prefix = messages[0]['content'] + '\n\n' %}{% set loop_messages = messages[1:] %}{% else %}{% set first_user_prefix = "" %}{% set loop_messages = messages %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = "model" %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"""
T['llama2'] = b"""{% if messages[0]['role'] == 'system' %}{% set system_message = '<<SYS>>\\n' + messages[0]['content'].strip() + '\\n<</SYS>>\\n\\n' %}{% set messages = messages[1:] %}{% else %}{% set system_message = '' %}{% endif %}{% for message in messages %}{% if loop.index0 == 0 %}{% set content = system_message + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"""
T['spin'] = b"{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}"
T['recurse'] = b"{% macro f(n) %}{{ f(n + 1) }}{{ f(n + 2) }}{% endmacro %}{{ f(0) }}"
T['strmul'] = b"{% set s = 'abcdefgh' * 100000 %}{% for m in messages %}{{ s * 100 }}{% endfor %}"
T['grow'] = b"{% set ns = namespace(x='a') %}{% for i in range(60) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x|length }}"
T['listgrow'] = b"{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}"
T['tojson'] = b"{% for m in messages %}{{ m|tojson }}{{ m.content.split(' ')|join('|') }}{{ m['role'].upper() }}{{ m.content.replace('x', 'yy') }}{% endfor %}{{ messages|length }}{{ loop }}"
T['methods'] = b"{% for k, v in {'a': 1, 'b': [1,2]}.items() %}{{ k }}={{ v }}{% if k.startswith('a') %}{% break %}{% endif %}{% endfor %}{{ 'x'.center(50) }}{{ '%s-%d'|format('a', 3) }}{{ range(5)|list|reverse|join }}{% filter upper %}abc{% endfilter %}"
T['raise'] = b"{% if messages|length > 1 %}{{ raise_exception('too many: ' ~ messages|length) }}{% endif %}{{ messages[99].content }}"
T['include'] = b"{% include 'tokenizer.chat_template' %}{% extends 'tokenizer.chat_template' %}{% import 'x' as y %}"
T['blocks'] = b"{% block a %}{% block b %}{{ super() }}{% endblock %}{% endblock %}{% call(x) f() %}{{ x }}{% endcall %}"
# Intermediate values that double per iteration: MiniJinja bounds neither `~` nor `+`, so these
# exhaust memory (see README, "Known out-of-memory inputs"); kept out of the seed corpus.
NAMES = {'grow': 'string-doubling', 'listgrow': 'list-doubling'}
for i, (name, template) in enumerate(T.items()):
    data = bytes([i & 0xF]) + template
    write('corpus-seed/chat_template', NAMES.get(name, name), data)

# tokenizer: the tokenizer (0-9 BPE pre-tokenizers, 10-12 lossy BPE, 13 SPM, 14 Gemma 4,
# 15 tokenizer.json), flags, then text or u16 ids.
texts = [b"Hello world, the thing is 12345 and 123!",
         "The caf\u00e9 r\u00e9sum\u00e9 \U0001F980! \u65e5\u672c\u8a9e\n\n\tcode();".encode(),
         b"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
         b"<s><start_of_turn>user <mask> the thing<end_of_turn>\n",
         b"  leading   spaces\n\n\n  and   tabs\t\t x xyz \xe2\x82\xac\xe2\x82\xac \xc3\xbc ",
         b"\xff\xfe invalid \xc3 utf8 \xed\xa0\x80",
         "I'm don't we'll 3.14159 1,000,000 \u0645\u0631\u062d\u0628\u0627 \u4f60\u597d \ud55c\uad6d\uc5b4 \u0301\u200d".encode(),
         b"<tool>x<tool><|endoftext|>"]
for kind in range(16):
    for j, text in enumerate(texts):
        if (kind + j) % 3 != 0 and kind not in (0, 13, 14, 15):
            continue
        write('corpus-seed/tokenizer', f'text-{kind:02d}-{j}', bytes([kind, (kind + j) % 4]) + text)
random.seed(7)
for kind in (1, 11, 13, 14, 15):
    ids = [random.randrange(0, 300) for _ in range(40)] + [0xFFFF, 2, 0xFFF0, 5, 6, 100]
    write('corpus-seed/tokenizer', f'ids-{kind:02d}', bytes([kind, 4]) + b''.join(struct.pack('<H', i) for i in ids))

# request: route and content type, --max-tokens-out choice, body.
R = [
    (0, 3, b'{"job_id":"j1","prompt":"Hello","max_tokens":16,"temperature":0.7,"top_k":40,"top_p":0.9,"min_p":0.05,"repetition_penalty":1.1,"stop":["\\n\\n","</s>"],"seed":42,"raw":false,"ignore_eos":true}'),
    (2, 2, b'{"job_id":"j2","prompt":"caf\\u00e9 \\ud83e\\udd80 \\ud800","max_tokens":4096,"temperature":3,"top_p":-1,"stop":["a","b","c","d","e"],"seed":-1,"raw":"yes"}'),
    (4, 6, b'{"job_id":"","prompt":"","max_tokens":0,"top_k":1e30,"min_p":null,"stop":[""],"seed":1.5}'),
    (0, 0, b'{"job_id":"j","prompt":"x","max_tokens":1.0,"temperature":2.0,"repetition_penalty":0,"stop":[1,null,{}],"job_id":"dup"}'),
    (0, 5, b'[1,2,3]'),
    (6, 4, b'{"job_id":"' + b'a' * 300 + b'","prompt":"' + b'p' * 40 + b'"}'),
    (0, 7, b'{"a":{"b":{"c":[[[[[[[[[[[]]]]]]]]]]]}},"prompt":"\\u0000","job_id":"\\n"}'),
    (8, 1, b'not json'),
    (1, 0, b'{"job_id":"abc"}'),
    (3, 0, b'{"job_id":123}'),
    (5, 0, b'{"job_id":"x"}'),
    (1, 0, b'{}'),
]
for i, (route, limit, body) in enumerate(R):
    write('corpus-seed/request', f'req-{i:02d}', bytes([route, limit]) + body)
