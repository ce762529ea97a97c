#!/usr/bin/env python3
"""The engine benchmark's extraction job run by llama.cpp under its own JSON-schema grammar
(llama-cpp-python, as the fixtures build it): the peer of `engine-bench --configs c` for records
that are right, not only valid.

    engine-bench --model M --docs 50 --write-prompts prompts.jsonl
    llama_cpp_extract_bench.py M schemas/debian-package.json prompts.jsonl outputs.jsonl [MAX_TOKENS]
    engine-bench --model M --docs 50 --peer outputs.jsonl

The prompts are quarry's token ids (the same chat template, instruction and record), so both see
the same tokens. Each is completed greedily (temperature 0) under the grammar llama.cpp makes
from the schema (`LlamaGrammar.from_json_schema`, llama.cpp's json-schema-to-grammar), at most
MAX_TOKENS (default 320) tokens, one document at a time (llama-cpp-python runs one sequence; it
keeps the previous prompt's KV cache for the shared instruction). Writes one {"text", "finish"}
line per document to OUTPUTS and prints the timing as JSON.
"""
import json
import sys
import time

import llama_cpp
from llama_cpp import Llama, LlamaGrammar

model, schema_path, prompts_path, out_path = sys.argv[1:5]
max_tokens = int(sys.argv[5]) if len(sys.argv) > 5 else 320
prompts = [json.loads(line)["ids"] for line in open(prompts_path) if line.strip()]
schema = json.load(open(schema_path))
grammar = LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
longest = max(len(p) for p in prompts)
llm = Llama(model_path=model, n_ctx=longest + max_tokens + 16, n_batch=512, n_ubatch=512,
            n_threads=2, verbose=False)
lines, output_tokens = [], 0
start = time.time()
for i, ids in enumerate(prompts):
    r = llm.create_completion(prompt=ids, max_tokens=max_tokens, temperature=0.0,
                              grammar=grammar)
    choice = r["choices"][0]
    output_tokens += r["usage"]["completion_tokens"]
    lines.append(json.dumps({"text": choice["text"], "finish": choice["finish_reason"]}))
    print(f"{i + 1}/{len(prompts)} {choice['finish_reason']}", file=sys.stderr, flush=True)
wall = time.time() - start
open(out_path, "w").write("\n".join(lines) + "\n")
print(json.dumps({
    "peer": "llama-cpp-python",
    "version": llama_cpp.__version__,
    "grammar": "LlamaGrammar.from_json_schema",
    "model": model,
    "docs": len(prompts),
    "max_tokens": max_tokens,
    "wall_s": wall,
    "docs_per_s": len(prompts) / wall,
    "output_tokens": output_tokens,
    "output_tokens_per_s": output_tokens / wall,
}))
