"""Structured output through OpenAI's SDK: requests with `response_format` json_schema at
T = 0.8 must all return JSON valid against their schema (checked with `jsonschema`).

Run by tests/tests/http_openai.rs against a real worker:

    PYTHONPATH=$ASSETS/python/sdk python3 tests/openai/structured_check.py http://127.0.0.1:PORT [ROUNDS]

Five schemas (nested objects, enums, arrays, numbers, arrays of objects), ROUNDS requests
each (10 by default: 50 in all), eight at a time. Exits non-zero naming every failure.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai

SCHEMAS = {
    "person": (
        "Describe a fictional person: their name, age and email.",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 24},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "email": {"type": "string", "maxLength": 40},
            },
            "required": ["name", "age"],
            "additionalProperties": False,
        },
    ),
    "palette": (
        "Pick a color and up to three tags for a painting.",
        {
            "type": "object",
            "properties": {
                "color": {"type": "string", "enum": ["red", "green", "blue"]},
                "tags": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 12},
                    "minItems": 1,
                    "maxItems": 3,
                },
            },
            "required": ["color", "tags"],
            "additionalProperties": False,
        },
    ),
    "address": (
        "Give the address of a made-up bakery and whether it is verified.",
        {
            "type": "object",
            "properties": {
                "address": {
                    "type": "object",
                    "properties": {
                        "street": {"type": "string", "maxLength": 30},
                        "city": {"type": "string", "maxLength": 20},
                        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                    },
                    "required": ["street", "city", "zip"],
                    "additionalProperties": False,
                },
                "verified": {"type": "boolean"},
            },
            "required": ["address", "verified"],
            "additionalProperties": False,
        },
    ),
    "order": (
        "Write an order for some apples: price, quantity and discount.",
        {
            "type": "object",
            "properties": {
                "price": {"type": "number", "minimum": 0, "maximum": 1000},
                "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                "discount": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["price", "quantity", "discount"],
            "additionalProperties": False,
        },
    ),
    "inventory": (
        "List one to three items in a toolbox with an id and a label.",
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "integer", "minimum": 0, "maximum": 9999},
                            "label": {"type": "string", "maxLength": 12},
                        },
                        "required": ["id", "label"],
                        "additionalProperties": False,
                    },
                }
            },
            "required": ["items"],
            "additionalProperties": False,
        },
    ),
}


def one(client, model, name, seed):
    question, schema = SCHEMAS[name]
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question + " Answer in JSON."}],
        temperature=0.8,
        seed=seed,
        max_tokens=256,
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema}},
    )
    text = reply.choices[0].message.content
    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError) as err:
        return f"{name} seed {seed}: {type(err).__name__}: {str(err).splitlines()[0]} in {text!r}"
    return None


def main():
    base = sys.argv[1].rstrip("/")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    jobs = [(name, seed) for seed in range(rounds) for name in SCHEMAS]
    with ThreadPoolExecutor(max_workers=8) as pool:
        failures = [f for f in pool.map(lambda job: one(client, model, *job), jobs) if f]
    for failure in failures:
        print(f"FAILED: {failure}")
    if failures:
        raise SystemExit(f"{len(failures)} of {len(jobs)} replies are not valid")
    print(f"structured_check: all {len(jobs)} replies valid ({model!r})")


if __name__ == "__main__":
    main()
