#!/usr/bin/env python3
"""llama.cpp's side of `model-bench`: the same GGUF, token ids and measurements as quarry's side.

Reads a JSON job on stdin ({"model", "threads", "prefill_tokens", "decode_prompts", "steps",
"batches", "repeats"}) and prints JSON results. Uses llama.cpp's C API through llama-cpp-python:
one context with n_seq_max sequences; a batched decode step is one llama_decode of one token per
sequence, then a greedy argmax per sequence on the host (quarry does the same).
"""
import ctypes
import json
import statistics
import sys
import time

import numpy as np
import llama_cpp as L


def main():
    job = json.load(sys.stdin)
    L.llama_backend_init()
    model = L.llama_model_load_from_file(job["model"].encode(), L.llama_model_default_params())
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    max_batch = max(job["batches"])
    cp = L.llama_context_default_params()
    cp.n_ctx = 8192
    cp.n_batch = 2048
    cp.n_ubatch = 512
    cp.n_seq_max = max_batch
    cp.n_threads = job["threads"]
    cp.n_threads_batch = job["threads"]
    cp.kv_unified = True
    ctx = L.llama_init_from_model(model, cp)
    mem = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(2048, 0, max_batch)

    def decode(items, want_logits):
        """items: (token, pos, seq) triples; want_logits: which indices return logits."""
        batch.n_tokens = len(items)
        for i, (tok, pos, seq) in enumerate(items):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = 1 if i in want_logits else 0
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def argmax(i):
        ptr = L.llama_get_logits_ith(ctx, i)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))

    results = {"generator": f"llama-cpp-python {L.__version__}", "threads": job["threads"]}
    # Prefill: the prompt in one call into an empty cache.
    runs = []
    for _ in range(job["repeats"]):
        L.llama_memory_clear(mem, True)
        toks = job["prefill_tokens"]
        t = time.perf_counter()
        decode([(tok, p, 0) for p, tok in enumerate(toks)], {len(toks) - 1})
        argmax(len(toks) - 1)
        runs.append(len(toks) / (time.perf_counter() - t))
    results["prefill_tok_s"] = statistics.median(runs)
    # Decode: B sequences, each prefilled untimed, then `steps` greedy steps of B tokens.
    for b in job["batches"]:
        runs = []
        for _ in range(job["repeats"]):
            L.llama_memory_clear(mem, True)
            prompts = job["decode_prompts"][:b]
            nxt = []
            for s, p in enumerate(prompts):
                decode([(tok, i, s) for i, tok in enumerate(p)], {len(p) - 1})
                nxt.append(argmax(len(p) - 1))
            t = time.perf_counter()
            for step in range(job["steps"]):
                decode([(nxt[s], len(prompts[s]) + step, s) for s in range(b)], set(range(b)))
                nxt = [argmax(s) for s in range(b)]
            runs.append(b * job["steps"] / (time.perf_counter() - t))
        results[f"decode_b{b}_tok_s"] = statistics.median(runs)
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
