#!/usr/bin/env python3
"""llama.cpp's decode speed on one GGUF on the CPU (llama-cpp-python, as the fixtures build it): the
CPU peer of `quarry bench --dummy-weights SHAPE --dummy-gguf FILE` at batch 1.

    llama_cpp_decode_bench.py FILE.gguf [PROMPT_TOKENS] [OUTPUT_TOKENS]

Evaluates PROMPT_TOKENS (default 494, the package benchmark's longest prompt) of the Apache
license text, then OUTPUT_TOKENS (default 32) greedy tokens one at a time, three times, 2 threads;
prints each run and the medians as JSON. Its prompt time is not comparable with quarry's TTFT:
llama-cpp-python here keeps every position's logits (`logits_all`), which adds a vocabulary
projection per prompt token; the decode time per token is.
"""
import json
import statistics
import sys
import time

import numpy as np
from llama_cpp import Llama

path = sys.argv[1]
prompt_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 494
output_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 32
llm = Llama(model_path=path, n_ctx=prompt_tokens + output_tokens + 16, n_batch=512, n_ubatch=512,
            n_threads=2, verbose=False, logits_all=True)
text = open("/usr/share/common-licenses/Apache-2.0").read()
toks = llm.tokenize(text.encode(), add_bos=False)[:prompt_tokens]
runs = []
for _ in range(3):
    llm.reset()
    start = time.time()
    llm.eval(toks)
    prompt_s = time.time() - start
    nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    start = time.time()
    for _ in range(output_tokens):
        llm.eval([nxt])
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    runs.append({"prompt_s": prompt_s, "tpot_ms": (time.time() - start) / output_tokens * 1000})
    print(runs[-1], file=sys.stderr, flush=True)
print(json.dumps({
    "peer": "llama-cpp-python",
    "model": path,
    "prompt_tokens": len(toks),
    "output_tokens": output_tokens,
    "runs": runs,
    "median_tpot_ms": statistics.median(r["tpot_ms"] for r in runs),
    "median_prompt_s": statistics.median(r["prompt_s"] for r in runs),
}))
