#!/usr/bin/env python3
"""transformers `generate` on the same GGUF, the baseline everyone knows (the GPU benchmarks' peer).

Loads the GGUF through transformers (its GGUF loader dequantizes the weights; `gguf` must be
importable), casts to bf16 on the GPU and times greedy `generate` at each batch size with the
shape `quarry bench` and `llama-batched-bench` use: PP prompt tokens and exactly TG new tokens
per sequence (EOS ignored). The prompt is fixed token ids, not text, so no tokenizer conversion
is involved. Timed with CUDA synchronisation after one warm-up per batch size; REPEATS runs, the
median reported. Writes one JSON object per batch size to --out and prints a table.

Run by infra/gpu-check.sh on the GPU machine, whose image has torch and transformers.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--batch", default="1,8,32,128", help="batch sizes, comma separated")
    ap.add_argument("--pp", type=int, default=700, help="prompt tokens per sequence")
    ap.add_argument("--tg", type=int, default=160, help="new tokens per sequence")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(os.path.abspath(a.model))
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    model = model.to("cuda").eval()
    load_s = time.perf_counter() - t0
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    results = []
    for b in [int(x) for x in a.batch.split(",") if x]:
        ids = torch.randint(100, vocab - 100, (b, a.pp), generator=gen).to("cuda")
        mask = torch.ones_like(ids)
        kw = dict(
            attention_mask=mask,
            max_new_tokens=a.tg,
            min_new_tokens=a.tg,
            do_sample=False,
            pad_token_id=0,
        )
        times, prefill = [], []
        try:
            with torch.inference_mode():
                model.generate(ids, **kw)  # warm-up
                for _ in range(a.repeats):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    out = model.generate(ids, **kw)
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - t)
                    assert out.shape == (b, a.pp + a.tg), out.shape
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    model(ids, attention_mask=mask, logits_to_keep=1)
                    torch.cuda.synchronize()
                    prefill.append(time.perf_counter() - t)
        except torch.cuda.OutOfMemoryError as e:
            results.append({"batch": b, "error": f"out of memory: {e}"})
            torch.cuda.empty_cache()
            continue
        s = statistics.median(times)
        p = statistics.median(prefill)
        results.append(
            {
                "batch": b,
                "pp": a.pp,
                "tg": a.tg,
                "seconds": s,
                "runs": times,
                "prefill_seconds": p,
                "output_tok_s": b * a.tg / s,
                "decode_tok_s": b * a.tg / max(s - p, 1e-9),
                "ms_per_step": (s - p) / a.tg * 1000,
            }
        )
    meta = {
        "peer": "transformers generate (bf16, greedy)",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "model": os.path.basename(a.model),
        "load_seconds": load_s,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    with open(a.out, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {meta['gpu']}")
    print(f"{'batch':>6} {'output tok/s':>13} {'decode tok/s':>13} {'ms/step':>8} {'prefill s':>10}")
    for r in results:
        if "error" in r:
            print(f"{r['batch']:>6} {r['error'][:60]}")
            continue
        print(
            f"{r['batch']:>6} {r['output_tok_s']:>13.1f} {r['decode_tok_s']:>13.1f} "
            f"{r['ms_per_step']:>8.2f} {r['prefill_seconds']:>10.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
