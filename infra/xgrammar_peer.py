#!/usr/bin/env python3
"""xgrammar as a peer of quarry's constraint benchmarks, in its own process.

xgrammar is a C++ library with Python bindings (no Rust crate), so the benchmarks
(`grammar-bench`, `cfg-bench`, `schema-bench`, `walk-bench`) start this script once per
vocabulary and talk to it in JSON lines on stdin and stdout (and `validity-bench` has it draw
records under its masks). It times its own calls with
`time.perf_counter_ns` around each xgrammar call, so no pipe is inside a timing; each timing
holds one Python call into the bindings, whose cost the `vocab` answer reports
(`call_overhead_us`: an empty call timed the same way) without subtracting it.

Requests (one JSON object a line; every answer is one line, `{"error": ...}` on failure):

    {"op": "vocab", "tokens": [HEX, ...], "eos": ID, "special": [ID, ...], "threads": N}
        The vocabulary as quarry holds it: each token's bytes in hex. Special tokens get bytes
        no UTF-8 text has (0xFF, then a name), so no constraint ever allows them as text, as
        the other peers do. Answers {"setup_ms", "version", "call_overhead_us"}.
    {"op": "walk", "spec": SPEC, "records": [[ID, ...], ...], "cold_reps": C, "warm_reps": W,
     "masks": BOOL, "final_mask": BOOL}
        C fresh compiles (no compiler cache), each followed by a walk of every record from a
        fresh matcher: a mask before each token and (unless "final_mask" is false) after the
        last, each timed. Then W walks of
        every record on the last compile (warm). Answers {"compile_us": [C], "first_mask_us":
        [C] (each compile's first mask), "cold": [C lists of µs], "warm": [µs], "warnings":
        [what xgrammar's compiler warned, such as a keyword it ignores], "masks": [...]}:
        with "masks": true, every mask of the first cold walk in order, as the hex of its
        little-endian 32-bit words (bit i % 32 of word i // 32 allows token i). No records: C
        compiles, each with its first mask. A token the mask does not allow, or that the
        matcher refuses, is an error naming the record and step.

    {"op": "begin", "spec": SPEC}, then {"op": "accept", "token": ID} ...
        One matcher stepped by the caller, untimed (to draw records every engine allows):
        each answers {"mask": HEX} (the mask for the next token, as above), and "accept" a
        token the matcher refuses with an error.

    {"op": "sample", "spec": SPEC, "count": N, "max_tokens": M, "seed": S, "closing": [ID]}
        N records drawn at random under xgrammar's own masks (what `validity-bench` checks):
        a record ends where its mask allows the stop token; otherwise a 64-bit LCG steps, and
        the next token is the smallest allowed one where its top four bits are below 5, the
        first allowed of CLOSING where they are 5 to 7 and it has one, else the allowed token
        the LCG picks (quarry-bench's `draw`, the same rule). Answers {"records":
        [{"text": HEX, "end": "stop" | "max_tokens" | "dead_end" | "refused"}], "warnings": [...]}.

SPEC is {"regex": TEXT}, {"schema": JSON}, {"json_object": true} or {"ebnf": TEXT}. Schemas
are compiled as quarry's compact layout (`any_whitespace=False`, separators "," and ":") and
without xgrammar's strict mode (a missing `additionalProperties` allows other properties, as
JSON Schema says and as quarry reads it).

The benchmarks run this script with the Python given as `--xgrammar-python`; `make
xgrammar-peer` makes one under $QUARRY_CACHE, and the `make bench-*` targets pass it where it
exists. xgrammar's package requires torch (about 5 GB with its CUDA libraries), so nothing else
installs it.
"""
import json
import os
import re
import sys
import tempfile
import time
from importlib.metadata import version

import numpy as np
import xgrammar as xgr


def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Peer:
    def __init__(self):
        self.info = None
        self.tokens = []
        self.threads = 1
        self.warnings = {}
        self.stepped = None
        self.stop = 0
        self.vocab_size = 0

    def vocab(self, req):
        start = time.perf_counter_ns()
        special = set(req.get("special", []))
        tokens = []
        for i, h in enumerate(req["tokens"]):
            if i in special:
                tokens.append(b"\xff<special_%d>" % i)
            else:
                tokens.append(bytes.fromhex(h))
        self.vocab_size = len(tokens)
        self.tokens = tokens
        self.stop = req["eos"]
        self.info = xgr.TokenizerInfo(
            tokens,
            xgr.VocabType.RAW,
            vocab_size=len(tokens),
            stop_token_ids=[req["eos"]],
            add_prefix_space=False,
        )
        self.threads = int(req.get("threads", 1))
        setup_ms = (time.perf_counter_ns() - start) / 1e6
        # What one timed call into the bindings costs with nothing to do.
        m = xgr.GrammarMatcher(self.compiler().compile_regex("a"))
        samples = []
        for _ in range(2000):
            t = time.perf_counter_ns()
            m.is_terminated()
            samples.append(time.perf_counter_ns() - t)
        samples.sort()
        return {
            "setup_ms": setup_ms,
            "version": version("xgrammar"),
            "call_overhead_us": samples[len(samples) // 2] / 1e3,
            "threads": self.threads,
        }

    def compiler(self):
        # A new compiler without a cache, so that every compile is a fresh one.
        return xgr.GrammarCompiler(self.info, max_threads=self.threads, cache_enabled=False)

    def compile(self, spec):
        c = self.compiler()
        if "regex" in spec:
            return c.compile_regex(spec["regex"])
        if "schema" in spec:
            return c.compile_json_schema(
                json.dumps(spec["schema"]),
                any_whitespace=False,
                separators=(",", ":"),
                strict_mode=False,
            )
        if "json_object" in spec:
            return c.compile_json_schema(
                json.dumps({"type": "object"}),
                any_whitespace=False,
                separators=(",", ":"),
                strict_mode=False,
            )
        if "ebnf" in spec:
            return c.compile_grammar(spec["ebnf"])
        raise ValueError(f"unknown spec {sorted(spec)}")

    def mask(self):
        return np.zeros((1, (self.vocab_size + 31) // 32), dtype=np.int32)

    def timed_compile(self, spec):
        """A fresh compile and its first mask, with both times in µs, and the warnings
        xgrammar's compiler wrote (to the process's stderr, where they are caught outside
        the timings)."""
        mask = self.mask()
        with tempfile.TemporaryFile() as caught:
            sys.stderr.flush()
            saved = os.dup(2)
            os.dup2(caught.fileno(), 2)
            try:
                t = time.perf_counter_ns()
                g = self.compile(spec)
                compiled = time.perf_counter_ns()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            caught.seek(0)
            text = caught.read().decode(errors="replace")
        for w in warnings_in(text):
            self.warnings.setdefault(w, None)
        m = xgr.GrammarMatcher(g)
        m.fill_next_token_bitmask(mask, 0)
        first = time.perf_counter_ns()
        return g, m, mask, (compiled - t) / 1e3, (first - compiled) / 1e3

    def walk_records(self, g, records, times, masks, final, matcher=None, mask=None):
        """Walks every record on `g`, timing each mask and adding it to `masks` (unless None);
        `matcher` and `mask` are the first record's matcher with its first mask already filled
        (its time already taken). `final`: a mask after each record's last token too."""
        for r, ids in enumerate(records):
            if matcher is None:
                m, mask = xgr.GrammarMatcher(g), self.mask()
                t = time.perf_counter_ns()
                m.fill_next_token_bitmask(mask, 0)
                times.append((time.perf_counter_ns() - t) / 1e3)
            else:
                m, matcher = matcher, None
            if masks is not None:
                masks.append(hex_words(mask))
            for i, tok in enumerate(ids):
                word = int(mask[0, tok // 32]) & 0xFFFFFFFF
                if not (word >> (tok % 32)) & 1:
                    raise ValueError(f"xgrammar does not allow {self.where(ids, i, r)}")
                if not m.accept_token(tok):
                    raise ValueError(f"xgrammar refused {self.where(ids, i, r)}")
                if i + 1 == len(ids) and not final:
                    break
                t = time.perf_counter_ns()
                m.fill_next_token_bitmask(mask, 0)
                times.append((time.perf_counter_ns() - t) / 1e3)
                if masks is not None:
                    masks.append(hex_words(mask))

    def begin(self, req):
        g, _, _, _, _ = self.timed_compile(req["spec"])  # its warnings caught, not repeated
        self.stepped = xgr.GrammarMatcher(g)
        return self.stepped_mask()

    def accept(self, req):
        tok = req["token"]
        if not self.stepped.accept_token(tok):
            raise ValueError(f"xgrammar refused token {tok} ({self.tokens[tok]!r})")
        return self.stepped_mask()

    def stepped_mask(self):
        mask = self.mask()
        self.stepped.fill_next_token_bitmask(mask, 0)
        return {"mask": hex_words(mask)}

    def sample(self, req):
        self.warnings = {}
        g, _, _, _, _ = self.timed_compile(req["spec"])
        stop, h, records = self.stop, req.get("seed", 0) & MASK64, []
        closing = req.get("closing", [])
        for _ in range(req["count"]):
            m, mask, text, end = xgr.GrammarMatcher(g), self.mask(), [], "max_tokens"
            for _ in range(req["max_tokens"]):
                m.fill_next_token_bitmask(mask, 0)
                bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[: self.vocab_size]
                if bits[stop]:
                    end = "stop"
                    break
                allowed = np.flatnonzero(bits)
                if len(allowed) == 0:
                    end = "dead_end"
                    break
                h = (h * 0x5851F42D4C957F2D + 0x14057B7EF767814F) & MASK64
                close = next((c for c in closing if bits[c]), None)
                if h >> 60 < 5:
                    tok = int(allowed[0])
                elif h >> 60 < 8 and close is not None:
                    tok = close
                else:
                    tok = int(allowed[(h >> 20) % len(allowed)])
                if not m.accept_token(tok):
                    end = "refused"  # a token its own mask allowed
                    break
                text.append(self.tokens[tok])
            records.append({"text": b"".join(text).hex(), "end": end})
        return {"records": records, "warnings": list(self.warnings)}

    def where(self, ids, i, r):
        """Token `i` of record `r`, with its bytes and the 40 bytes before it."""
        before = b"".join(self.tokens[t] for t in ids[:i])[-40:]
        return f"token {i} ({ids[i]}, {self.tokens[ids[i]]!r}) of record {r}, after {before!r}"

    def walk(self, req):
        spec, records, final = req["spec"], req["records"], req.get("final_mask", True)
        self.warnings = {}
        compile_us, first_us, cold, warm, masks = [], [], [], [], []
        g = None
        for rep in range(max(1, req.get("cold_reps", 1))):
            g, m, mask, c, f = self.timed_compile(spec)
            compile_us.append(c)
            first_us.append(f)
            times = [f]
            keep = masks if rep == 0 and req.get("masks") else None
            self.walk_records(g, records, times, keep, final, m, mask)
            cold.append(times)
        for _ in range(req.get("warm_reps", 0)):
            self.walk_records(g, records, warm, None, final)
        return {
            "compile_us": compile_us,
            "first_mask_us": first_us,
            "cold": cold,
            "warm": warm,
            "masks": masks,
            "warnings": list(self.warnings),
        }


MASK64 = (1 << 64) - 1


def warnings_in(text):
    """The messages of the `[time] file:line: Warning: message` lines xgrammar logs."""
    return [m.group(1).strip() for m in re.finditer(r"Warning: (.*)", text)]


def hex_words(mask):
    """The mask as the hex of its little-endian 32-bit words (bit i % 32 of word i // 32)."""
    return mask.astype("<i4").tobytes().hex()


def main():
    peer = Peer()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "vocab":
                out(peer.vocab(req))
            elif op == "walk":
                out(peer.walk(req))
            elif op == "sample":
                out(peer.sample(req))
            elif op == "begin":
                out(peer.begin(req))
            elif op == "accept":
                out(peer.accept(req))
            else:
                out({"error": f"unknown op {op!r}"})
        except Exception as e:  # every failure is an answer, so the benchmark goes on
            out({"error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    main()
