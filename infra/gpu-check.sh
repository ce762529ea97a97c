#!/usr/bin/env bash
# The whole GPU check and benchmark (constrained extraction on the GPU), on the GPU machine, from what `make gpu-pack`
# built here (docs/gpu.md). Each device call carries one chunk (.gpu/pN) and runs this script: it
# keeps the chunk in $STAGE_DIR (the machine stays warm between calls) and, once it holds every
# chunk, verifies and unpacks them and runs, in order:
#   1. the GPU: name, driver, memory, clocks;
#   2. the CUDA kernel tests (each kernel against its plain-Rust reference) and the model tests
#      (paged forward, llama.cpp fixtures, greedy continuations; SmolLM2 as an f16 checkpoint
#      folder, built here from the carried GGUF) on cuda:0;
#   3. the attention kernel's layouts timed against a device copy (attention-bench), the 8B
#      shape's projections at a decode step's rows (projection-bench), and
#      `quarry generate --device cuda:0`, free and constrained;
#   4. the peers on the same GPU and GGUF, first (they are quick): llama.cpp's
#      `llama-batched-bench` (CUDA build) and transformers `generate` (bf16);
#   5. `quarry bench --device cuda:0` over the batch sweep and modes (and, with PIPELINE_BATCHES,
#      the dataset job against the engine alone: pipeline-bench);
# then prints one table. Raw results go to $OUT (the device tool brings them back).
# Variables: BATCHES (default 1,8,32,128,256,512; empty: no sweep), MODES (default a,b,c: no constraint, schema
# without jump-forward, schema with it), REPEATS (default 3: medians of 3),
# DOCS (default: the batch size, 16 at least), PP and TG (the peers' prompt and output tokens, default 700
# and 160, about quarry's documents), CALL_SECONDS (default 570: every step gets a share of what
# is left, so the call ends inside the device tool's 10 minutes and says what did not run),
# DUMMY="llama3.1-8b …" (a call of dummy-weight runs only, with DUMMY_BATCHES), TESTS=0 (skip the tests, attention-bench and generate), TESTS_SECONDS (default 210 of
# CALL_SECONDS: when the tests must end; a lease that runs them alone, or before DUMMY runs in
# the same command, gives them more: 2026-11-28, 170 seconds of which 107 were kept for the
# steps after them cut every test binary short), STAGE_DIR (default /root/quarry-gpu), AB_SECONDS (default 150: kept for the A/B runs), PEERS=0 (skip llama.cpp and transformers, for a short
# call after they were measured on the same GPU kind; PEERS=llama: llama.cpp only).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
STAGE_DIR="${STAGE_DIR:-/root/quarry-gpu}"
OUT="${OUT:-target/gpu-check}"
mkdir -p "$STAGE_DIR" "$OUT"
section() { printf '\n== %s\n' "$*"; }
END=$(( $(date +%s) + ${CALL_SECONDS:-570} ))
# Seconds a step may take: at most $1, leaving $2 for the steps after it (at least 10).
budget() { local left=$(( END - $(date +%s) - $2 )); [ "$left" -gt "$1" ] && left=$1; [ "$left" -lt 10 ] && left=10; echo "$left"; }

# Keep this call's chunk, and stop here until every chunk has come.
# (Moved, not copied: the device machine keeps carried paths between calls, and a chunk left in
# the tree would be taken again by a later check of another pack.)
find .gpu -name 'chunk.*' -exec mv {} "$STAGE_DIR/" \; 2>/dev/null
first="$(ls "$STAGE_DIR"/chunk.* 2>/dev/null | head -1)"
[ -n "$first" ] || { echo "no chunk carried: carry .gpu/p1 (make gpu-pack)"; exit 2; }
total="${first##*-of-}"
have="$(ls "$STAGE_DIR"/chunk.*-of-"$total" | wc -l)"
if [ "$have" -lt "$total" ]; then
  echo "holding $have of $total chunks in $STAGE_DIR; carry the next one in the next call"
  exit 0
fi
PACK="$STAGE_DIR/pack"
if [ ! -s "$PACK/SHA256SUMS" ]; then
  mkdir -p "$PACK"
  for i in $(seq 1 "$total"); do cat "$STAGE_DIR/chunk.$i-of-$total"; done | tar -C "$PACK" -xf - || exit 1
  (cd "$PACK" && sha256sum -c --quiet SHA256SUMS) || { echo "a chunk is damaged: pack again"; rm -rf "$PACK"; exit 1; }
  tar -C "$PACK" -xJf "$PACK/binaries.tar.xz" || exit 1
fi
MODEL="$(ls "$PACK"/*.gguf | head -1)"
mkdir -p models
ln -sf "$MODEL" "models/$(basename "$MODEL")"
# quarry's commands run the carried model (SmolLM2 by default; `MODEL=… make gpu-pack` carries
# another, e.g. Qwen2.5 in about a dozen chunks).
export QUARRY_MODEL="models/$(basename "$MODEL")"
Q="$PACK/bin/quarry"
STATUS="$PACK/status"
python3 -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile --target "$STAGE_DIR/site" "$PACK"/gguf-*.whl $(ls "$PACK"/safetensors-*.whl 2>/dev/null) \
  && export PYTHONPATH="$STAGE_DIR/site${PYTHONPATH:+:$PYTHONPATH}"
# The CUDA 13 runtime, cuBLAS, cuRAND and NVRTC that the binaries load: PyTorch's wheels have them.
libdirs="$(find / -xdev \( -name 'libcublas.so.13' -o -name 'libcudart.so.13' -o -name 'libnvrtc.so.13' -o -name 'libcurand.so.10' \) -printf '%h\n' 2>/dev/null | sort -u | paste -sd:)"
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BATCHES="${BATCHES-1,8,32,128,256,512}"
largest="$(tr ',' '\n' <<<"$BATCHES" | sort -n | tail -1)"
# merge_runs OUT [SETTING=]FILE...: the results of several `quarry bench` JSON files in one, each
# result tagged with its SETTING (an environment variable) when one is given.
merge_runs() {
  python3 - "$@" <<'MERGE'
import json, sys
merged = None
for arg in sys.argv[2:]:
    setting, _, path = arg.rpartition("=") if arg.count("=") > 1 else ("", "", arg)
    try:
        d = json.load(open(path))
    except OSError as e:
        print(f"{path}: not written ({e})")
        continue
    if setting:
        for r in d["results"]:
            r["env"] = setting
    if merged is None:
        merged = d
    else:
        merged["results"] += d["results"]
if merged is not None:
    json.dump(merged, open(sys.argv[1], "w"), indent=1)
MERGE
}
status=0

# SmolLM2 as a Hugging Face checkpoint folder in f16 (tests/fixtures/checkpoints.py, the tokenizer
# files packed beside the model): the checkpoint tests and a `quarry generate` run it on the GPU.
CHECKPOINT=""
if [ -d "$PACK/checkpoint-tokenizer" ] && [ -s models/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  if [ -s models/checkpoints/smollm2/model.safetensors ] \
    || python3 tests/fixtures/checkpoints.py models/checkpoints --only smollm2 --dtype f16 \
      --tokenizer-from "$PACK/checkpoint-tokenizer" >/dev/null; then
    CHECKPOINT=models/checkpoints/smollm2
  else
    echo "!! the f16 checkpoint folder was not built: its tests fail below"
    status=1
  fi
fi

# The tiny random-weight models of the new architectures (tests/fixtures/tiny_models.py: Qwen3,
# Llama 3.1's RoPE factors, Gemma 3's linear scaling, YaRN, Mistral's window), built here as make test
# builds them: the script reads only their tokenizers' metadata, which the pack carries
# (Qwen2.5's and Gemma 3's as the dummy-weight tokenizers, SmolLM2's as the model), so each source
# file is stood in for by its metadata while the script runs (Gemma 3's without the chat template
# the pack added). The tests check each file's sha256 against the one llama.cpp saw.
TINY_BUILT=0
if [ ! -s models/tiny/tiny-mistral.gguf ] && [ -s "$PACK/dummy-tokenizer.tok" ] \
  && [ -s "$PACK/dummy-tokenizer-gemma3.tok" ] && [ -s models/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  ln -sf "$PACK/dummy-tokenizer.tok" models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
  python3 - "$PACK/dummy-tokenizer-gemma3.tok" models/gemma-3-270m-q4_k_m.gguf <<'PY'
import sys
import gguf
src = gguf.GGUFReader(sys.argv[1])
w = gguf.GGUFWriter(sys.argv[2], src.fields["general.architecture"].contents())
for key, f in src.fields.items():
    if key.startswith("tokenizer.") and key != "tokenizer.chat_template":
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), f.types[0], sub_type=sub)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
PY
  python3 tests/fixtures/tiny_models.py models/tiny || echo "!! the tiny models were not built: their tests fail below"
  rm -f models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf models/gemma-3-270m-q4_k_m.gguf
fi
[ -s models/tiny/tiny-mistral.gguf ] && TINY_BUILT=1

section "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt" || status=1
# The commit the pack's binaries were built from (make gpu-pack; absent from packs before it).
echo "quarry commit: $(cat "$PACK/COMMIT" 2>/dev/null || echo unknown)" | tee -a "$OUT/gpu.txt"

# Dummy weights (DUMMY="llama3.1-8b qwen3-8b", docs/checkpoints.md): a call with DUMMY runs only
# this. Per shape: quarry bench mode a with random weights built on the GPU, one batch size of
# DUMMY_BATCHES (default 1,8,32,64,128,256) at a time with that many documents (16 at least, 4 at
# batch 1), each record capped at TG (160) output tokens, medians of REPEATS, the GPU's memory in
# use sampled every quarter second during each (its peak in dummy-SHAPE-peak.csv); then the same
# weights written as a GGUF (--dummy-gguf) run by llama-batched-bench (not with PEERS=0); a batch
# over the KV capacity, which must be refused with its message (not with DUMMY_OVER=0); the
# DUMMY_AB settings (QUARRY_PROFILE=1@256 prints the forward pass's phases into the log); a table.
# The opt-in kernels an A/B setting may name, each with the GPU test it must have passed in this
# lease (the tests' output stays on the machine between calls): pattern|test|what.
GATED_FORMS=(
  "QUARRY_Q8_GEMV|gemv_q8_matches_its_reference|gemv_q8"
  "QUARRY_Q8_GEMV|gemv_q8_add_and_glu_match_their_references|gemv_q8's adding and GLU forms"
  "QUARRY_Q8_GEMV|gemv_q8_rope_matches_the_gemv_then_rope_store|gemv_q8's RoPE form"
  "QUARRY_Q8_GEMV|the_8_bit_gemv_s_epilogues_keep_the_logits|gemv_q8's epilogues in the forward pass"
  "QUARRY_ATTENTION=tiled|paged_attention_tiled_matches_its_reference_on_a_mixed_batch|the tiled attention"
  "QUARRY_ATTENTION=cascade|paged_attention_cascade_matches_its_reference_on_a_mixed_batch|the cascade attention"
  "QUARRY_SPLIT_COMBINE|the_last_block_combine_matches_the_combine_s_launch|split-K's last-block combine"
  "QUARRY_ATTENTION_PREFETCH|the_prefetch_and_the_staged_keys_keep_the_output_bits|the attention's L2 prefetch"
  "QUARRY_ATTENTION_KEYS|the_prefetch_and_the_staged_keys_keep_the_output_bits|the attention's staged key reads"
  "QUARRY_GEMV_PREFETCH|the_gemv_prefetch_keeps_the_sums|gemv_q8's L2 prefetch"
)
# untested SETTING: prints the kernel SETTING names that did not pass its test this lease (and
# succeeds), or fails where there is none (or no test ran this lease).
untested() {
  local g pat test what
  [ -s "$STAGE_DIR/tests-raw.txt" ] || return 1
  for g in "${GATED_FORMS[@]}"; do
    IFS='|' read -r pat test what <<<"$g"
    if [[ "$1" == *"$pat"* ]] && ! grep -q "$test \\.\\.\\. ok" "$STAGE_DIR/tests-raw.txt"; then
      echo "$what"; return 0
    fi
  done
  return 1
}
# Documents a dummy run takes at batch B: B, 16 at least, but 4 at batch 1 (an 8B model's
# records one after another: four give its step time).
dummy_docs() { if [ "$1" = 1 ]; then echo 4; elif [ "$1" -gt 16 ]; then echo "$1"; else echo 16; fi; }
if [ -n "${DUMMY:-}" ]; then
  # Where this lease's tests ran (an earlier call or command) and the default attention layout or
  # its split-K form did not pass, the dummy runs take the same fallback as the sweep below.
  if [ -s "$STAGE_DIR/tests-raw.txt" ]; then
    if ! grep -q "paged_attention_warps_matches_its_reference_on_a_mixed_batch \.\.\. ok" "$STAGE_DIR/tests-raw.txt"; then
      echo "!! the attention kernel's warps layout did not pass its test this lease: QUARRY_ATTENTION=gather"
      export QUARRY_ATTENTION=gather
    elif ! grep -q "paged_attention_split_matches_its_reference_on_a_mixed_batch \.\.\. ok" "$STAGE_DIR/tests-raw.txt"; then
      echo "!! the attention kernel's split-K form did not pass its test this lease: QUARRY_ATTENTION=warps"
      export QUARRY_ATTENTION=warps
    fi
  fi
  tok="$PACK/dummy-tokenizer.tok"
  [ -s "$tok" ] || tok="$MODEL"
  batches="${DUMMY_BATCHES:-1,8,32,64,128,256}"
  for shape in $DUMMY; do
    section "dummy weights: $shape, quarry bench mode a"
    shape_tok="$tok"
    case "$shape" in llama3*) v=llama3 ;; mistral-nemo*) v=mistral-nemo ;; gemma3*) v=gemma3 ;; *) v= ;; esac
    [ -n "$v" ] && [ -s "$PACK/dummy-tokenizer-$v.tok" ] && shape_tok="$PACK/dummy-tokenizer-$v.tok"
    echo "batch,peak_mib" > "$OUT/dummy-$shape-peak.csv"
    gguf="$STAGE_DIR/dummy-$shape.gguf"
    runs=()
    # The sweep leaves time for llama.cpp (150 s) and the refusal (30 s) when they run.
    reserve=20
    [ "${PEERS:-1}" != 0 ] && reserve=$(( reserve + 150 ))
    [ "${DUMMY_OVER:-1}" != 0 ] && reserve=$(( reserve + 30 ))
    for b in $(tr ',' ' ' <<<"$batches"); do
      left=$(( END - $(date +%s) - reserve ))
      [ "$left" -lt 20 ] && { echo "batch $b and larger: not run (the call's time is spent)"; break; }
      write=()
      # The GGUF for llama.cpp (8.5 GB for an 8B shape) only where llama.cpp runs.
      [ -s "$gguf" ] || [ "${PEERS:-1}" = 0 ] || write=(--dummy-gguf "$gguf")
      nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$STAGE_DIR/memory-$b.csv" 2>/dev/null &
      smi=$!
      timeout "$left" "$Q" bench --device cuda:0 --dummy-weights "$shape" --dummy-tokenizer "$shape_tok" \
        "${write[@]}" --status "$STATUS" --modes a --batch "$b" --docs "$(dummy_docs "$b")" \
        --max-tokens "${TG:-160}" --repeats "${REPEATS:-3}" --step-tokens 4096 \
        --out "$STAGE_DIR/dummy-$shape-$b.json" 2>&1 | tee -a "$OUT/dummy-$shape.log" | grep -v '^batch .* run '
      [ "${PIPESTATUS[0]}" = 0 ] && runs+=("$STAGE_DIR/dummy-$shape-$b.json") || status=1
      kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
      echo "$b,$(sort -n "$STAGE_DIR/memory-$b.csv" | tail -1)" >> "$OUT/dummy-$shape-peak.csv"
    done
    if [ "${PEERS:-1}" != 0 ] && [ -x "$PACK/bin/llama-batched-bench" ] && [ -s "$gguf" ]; then
      section "dummy weights: $shape, llama-batched-bench on the same weights"
      llama_batches="$(tr ',' '\n' <<<"$batches" | awk '$1 <= 256' | paste -sd,)"
      largest="$(tr ',' '\n' <<<"$llama_batches" | sort -n | tail -1)"
      timeout "$(budget 200 40)" "$PACK/bin/llama-batched-bench" -m "$gguf" -ngl 99 \
        -c "$(( largest * (${PP:-700} + ${TG:-160}) + 4096 ))" -b 2048 -ub 512 \
        -npp "${PP:-700}" -ntg "${TG:-160}" -npl "$llama_batches" --output-format jsonl \
        2>"$OUT/dummy-$shape-llama.log" | tee "$OUT/dummy-$shape-llama.jsonl" || status=1
    fi
    # A batch over what the GPU's free memory holds is refused before it runs, with the largest
    # that fits (never an out-of-memory crash): one such run, which must fail with that message.
    section "dummy weights: $shape, a batch over the KV capacity"
    if [ "${DUMMY_OVER:-1}" = 0 ]; then
      echo "not run (DUMMY_OVER=0)"
    elif timeout "$(budget 120 0)" "$Q" bench --device cuda:0 --dummy-weights "$shape" --dummy-tokenizer "$shape_tok" \
      --status "$STATUS" --modes a --batch 100000 --docs 16 --max-tokens "${TG:-160}" --repeats 1 \
      --out "$STAGE_DIR/dummy-$shape-over.json" > "$OUT/dummy-$shape-over.log" 2>&1; then
      echo "!! batch 100000 ran: it should have been refused"; status=1
    elif grep -q "over the .* the GPU's free memory holds" "$OUT/dummy-$shape-over.log"; then
      grep -E "KV capacity|Error|batch 100000" "$OUT/dummy-$shape-over.log"
    else
      echo "!! batch 100000 failed without the capacity error:"; tail -5 "$OUT/dummy-$shape-over.log"; status=1
    fi
    # DUMMY_AB (space separated VAR=value[,VAR=value…]@BATCH): the same shape with other runtime
    # settings, e.g. QUARRY_DENSE_FROM_ROWS=9@1 (candle's quantized Q8_0 kernels for steps under 9
    # rows, the weights llama.cpp multiplies, where the default multiplies their f16 copies), or
    # QUARRY_DENSE_FROM_ROWS=9,QUARRY_Q8_GEMV=on@1 (quarry's 8-bit GEMV there instead).
    for entry in ${DUMMY_AB:-}; do
      setting="${entry%@*}" b="${entry##*@}"
      # An opt-in kernel (gemv_q8, the tiled or cascade attention) only where its test passed
      # earlier in this lease.
      if failed="$(untested "$setting")"; then
        echo "$setting at batch $b: not run ($failed did not pass its test)"; continue
      fi
      left=$(( END - $(date +%s) - 10 ))
      [ "$left" -lt 20 ] && { echo "$setting at batch $b: not run (the call's time is spent)"; continue; }
      section "dummy weights: $shape with $setting, batch $b"
      env $(tr ',' ' ' <<<"$setting") timeout "$left" "$Q" bench --device cuda:0 --dummy-weights "$shape" \
        --dummy-tokenizer "$shape_tok" --status "$STATUS" --modes a --batch "$b" --docs "$(dummy_docs "$b")" \
        --max-tokens "${TG:-160}" --repeats "${REPEATS:-3}" --step-tokens 4096 \
        --out "$STAGE_DIR/dummy-$shape-ab-$b-${setting//[^A-Za-z0-9]/_}.json" 2>&1 | tee -a "$OUT/dummy-$shape.log" \
        | grep -v '^batch .* run '
      [ "${PIPESTATUS[0]}" = 0 ] && runs+=("$setting=$STAGE_DIR/dummy-$shape-ab-$b-${setting//[^A-Za-z0-9]/_}.json")
    done
    merge_runs "$OUT/dummy-$shape.json" "${runs[@]}"
    section "dummy weights: $shape, summary"
    python3 - "$OUT" "$shape" <<'SUMMARY'
# Output tokens/s over wall time and the step time by batch: quarry (median of its runs; TPOT),
# llama.cpp on the same weights (over its whole run / its decode phase; its step), quarry's
# peak GPU memory in use.
import csv, json, os, sys
out, shape = sys.argv[1], sys.argv[2]
rows = {}
try:
    for r in json.load(open(os.path.join(out, f"dummy-{shape}.json")))["results"]:
        m = r["median"]
        key = "quarry" + (f" {r['env']}" if "env" in r else "")
        rows.setdefault(r["batch"], {})[key] = f"{m['output_tokens_per_s']:.0f} ({m['tpot_ms']:.2f} ms)"
except (OSError, ValueError, KeyError) as e:
    print("quarry: no results", e)
try:
    for line in open(os.path.join(out, f"dummy-{shape}-llama.jsonl")).readlines() + \
            open(os.path.join(out, f"dummy-{shape}-llama.log")).readlines():
        if line.startswith("{"):
            r = json.loads(line)
            rows.setdefault(r["pl"], {})["llama.cpp"] = (
                f"{r['pl'] * r['tg'] / r['t']:.0f} / {r['speed_tg']:.0f} ({1e3 * r['t_tg'] / r['tg']:.2f} ms)")
except (OSError, ValueError, KeyError) as e:
    print("llama.cpp: no results", e)
try:
    for r in csv.DictReader(open(os.path.join(out, f"dummy-{shape}-peak.csv"))):
        rows.setdefault(int(r["batch"]), {})["peak MiB"] = r["peak_mib"]
except (OSError, ValueError, KeyError) as e:
    print("memory: no samples", e)
cols = sorted({k for r in rows.values() for k in r})
print(f"{shape}: output tokens/s (step ms), by batch size")
print(f"{'batch':>6} " + " ".join(f"{c:>28}" for c in cols))
for b in sorted(rows):
    print(f"{b:>6} " + " ".join(f"{rows[b].get(c, '-'):>28}" for c in cols))
SUMMARY
  done
  exit $status
fi

# One model is carried: the tests of the other models' files are skipped here (they run in CI),
# and of the library's unit tests only the kernels' (the rest run in CI, without a GPU). The tiny
# random-weight models (models/tiny/, 212 MB that do not compress) are not carried either.
case "$(basename "$MODEL")" in
  qwen2.5*) model_tests=(qwen25) ;;
  gemma-3*) model_tests=(gemma3) ;;
  *) model_tests=(--skip gemma3 --skip qwen25 --skip checkpoints_read_into) ;;
esac
[ "$TINY_BUILT" = 1 ] || model_tests+=(--skip tiny_)
# Without the checkpoint folder (a pack made where `make test`'s set-up had not run), its tests
# would fail on a missing folder, not on the GPU: left out, and said.
if [ -z "$CHECKPOINT" ]; then
  echo "!! no f16 checkpoint folder (the pack carries no checkpoint tokenizer): its tests are left out"
  model_tests+=(--skip checkpoints_)
fi
# TESTS=0: straight to the benchmarks (a second call on binaries whose tests passed this lease).
split_ok=1
failed_fusions=()
if [ "${TESTS:-1}" != 0 ]; then
: > "$STAGE_DIR/tests-raw.txt"
# The tests end TESTS_SECONDS (default 210 of the 570) after the call began, leaving the rest
# for what follows them; a call of tests alone (BATCHES= PEERS=0) gives them all but 30.
after_tests=$(( ${CALL_SECONDS:-570} - ${TESTS_SECONDS:-$(( ${CALL_SECONDS:-570} * 210 / 570 ))} ))
for t in "$PACK"/tests/quarry_model-* $(ls "$PACK"/tests/* | grep -v '/quarry_model-'); do
  section "tests $(basename "$t") on cuda:0"
  only=("${model_tests[@]}")
  case "$(basename "$t")" in quarry_model-*) only=(cuda::) ;; esac
  QUARRY_TEST_DEVICE=cuda:0 QUARRY_ROOT="$PWD" timeout "$(budget 180 "$after_tests")" "$t" "${only[@]}" \
    --test-threads 1 2>&1 | tee -a "$STAGE_DIR/tests-raw.txt" | grep -Ev '^test .* \.\.\. ok$' | tail -40 || status=1
done 2>&1 | tee "$OUT/tests.txt"
# A kernel that fails its test (or crashes it) would make every timing after it meaningless: the
# rest of the call then runs with that kernel's fallback, and says so.
passed() { grep -q "$1 \.\.\. ok" "$STAGE_DIR/tests-raw.txt"; }
# Every "!! … failed" below means "did not pass": where no test failed, the time limit cut the
# tests short (TESTS_SECONDS), which this says once.
if ! grep -q "\.\.\. FAILED" "$STAGE_DIR/tests-raw.txt" && grep -q "^running [0-9]* test" "$STAGE_DIR/tests-raw.txt" \
  && [ "$(grep -c '^test result:' "$STAGE_DIR/tests-raw.txt")" -lt "$(grep -c '^running [0-9]* test' "$STAGE_DIR/tests-raw.txt")" ]; then
  echo "!! no test failed, but some test binaries did not finish in their time (raise TESTS_SECONDS): what did not run counts as failed below"
fi
# The attention kernel's default layout is `warps`; `per-dimension` is its other one.
if ! passed paged_attention_warps_matches_its_reference_on_a_mixed_batch; then
  if passed paged_attention_matches_its_reference_on_a_mixed_batch; then
    echo "!! the attention kernel's warps layout failed its test: QUARRY_ATTENTION=per-dimension from here on"
    export QUARRY_ATTENTION=per-dimension
  else
    echo "!! the attention kernel failed its tests: QUARRY_ATTENTION=gather from here on"
    export QUARRY_ATTENTION=gather
  fi
fi
# The forward pass's own kernels (RoPE and the KV writes, the norm and residual add, the GLU)
# have no fallback: if one failed, the GPU's forward pass is wrong, and the call stops here so
# that the device time left goes to finding out why.
for t in rope_qk_matches_its_reference store_rows_matches_its_reference \
  residual_ops_match_their_reference glu_matches_its_reference; do
  if ! passed "$t"; then
    echo "!! $t failed: the GPU forward pass is wrong; nothing after the tests runs"
    exit 1
  fi
done
# Split-K (QUARRY_ATTENTION=split) is measured below only when its test passed.
split_ok=1
if ! passed paged_attention_split_matches_its_reference_on_a_mixed_batch; then
  echo "!! the attention kernel's split-K form failed its test: QUARRY_ATTENTION=warps from here on (small steps default to split), its A/B runs left out"
  export QUARRY_ATTENTION=warps
  split_ok=0
fi
# The opt-in forms (the tiled and cascade attention, gemv_q8) likewise: their A/B runs only where
# their tests passed (GATED_FORMS).
for g in "${GATED_FORMS[@]}"; do
  IFS='|' read -r pat test what <<<"$g"
  passed "$test" || echo "!! $what failed its test: its A/B runs left out"
done
# The forward pass's optional fusions likewise: each when its kernel's test passed, all of them
# when the forward with them gave the logits of the forward without them.
for fusion in GEMM_ADD:gemm_add_matches_its_reference ADD_NORM:add_norm_matches_add_into_then_rms_norm \
  ROPE_STORE:rope_store_matches_rope_qk_and_store_rows; do
  if ! passed "${fusion#*:}"; then
    echo "!! QUARRY_${fusion%%:*}=on failed its test (${fusion#*:}): its A/B runs are left out"
    failed_fusions+=("${fusion%%:*}")
  fi
done
if ! passed the_fusions_keep_the_logits; then
  echo "!! the fusions failed the logits test: their A/B runs are left out"
  failed_fusions+=(GEMM_ADD ADD_NORM ROPE_STORE)
fi
if ! passed cuda_graphs_replay_the_steps_they_capture; then
  echo "!! the steps' CUDA graphs failed their test: QUARRY_CUDA_GRAPHS=off from here on"
  export QUARRY_CUDA_GRAPHS=off
fi
if ! passed sampling_matches_the_host_draw_row_for_row || ! passed mask_uploads_alternate_grow_and_arrive_whole; then
  echo "!! the sampling kernel or the mask upload failed its test: QUARRY_SAMPLING=host from here on"
  export QUARRY_SAMPLING=host
fi

section "the attention kernel's layouts (attention-bench)"
timeout 60 "$PACK/bin/attention-bench" || status=1
# Llama 3.1 8B's heads (32 on 8 of 128), where the 8B shape's step at batch 256 spent half its
# time in attention (BENCHMARKS.md, 2026-11-28).
timeout 60 "$PACK/bin/attention-bench" 800 llama3-8b || status=1
# The 8B shape's projections as the dense path multiplies them, at a decode step's rows for each
# batch: their share of the batch-256 step without the profile's synchronizations.
section "the projections of the 8B shape (projection-bench)"
timeout 90 "$PACK/bin/projection-bench" llama3.1-8b || status=1

section "quarry generate --device cuda:0"
timeout 60 "$Q" generate --device cuda:0 --chat --max-tokens 48 \
  --prompt "What is the Debian package manager called? Answer in one sentence." || status=1
timeout 60 "$Q" generate --device cuda:0 --chat --schema schemas/debian-package.json --max-tokens 160 --stats \
  --prompt "$(grep -A12 '^Package: dpkg$' "$STATUS")" || status=1
if [ -n "$CHECKPOINT" ]; then
  section "quarry generate --device cuda:0 on the f16 checkpoint folder"
  timeout 60 "$Q" generate --model "$CHECKPOINT" --device cuda:0 --chat \
    --schema schemas/debian-package.json --max-tokens 160 --stats \
    --prompt "$(grep -A12 '^Package: dpkg$' "$STATUS")" || status=1
fi

fi
PEERS="${PEERS:-1}"
if [ "$PEERS" != 0 ] && [ ! -x "$PACK/bin/llama-batched-bench" ]; then
  echo "!! llama.cpp was not packed (PEERS=0 make gpu-pack): the peers do not run"
  PEERS=0
fi
if [ "$PEERS" != 0 ]; then
section "llama.cpp llama-batched-bench (CUDA, all layers on the GPU)"
# llama.cpp holds at most 256 sequences in one context (n_seq_max): larger batches are not run.
llama_batches="$(tr ',' '\n' <<<"$BATCHES" | awk '$1 <= 256' | paste -sd,)"
llama_largest="$(tr ',' '\n' <<<"$llama_batches" | sort -n | tail -1)"
ctx=$(( llama_largest * (${PP:-700} + ${TG:-160}) + 4096 ))
timeout "$(budget 120 270)" "$PACK/bin/llama-batched-bench" -m "$MODEL" -ngl 99 -c "$ctx" -b 2048 -ub 512 \
  -npp "${PP:-700}" -ntg "${TG:-160}" -npl "$llama_batches" --output-format jsonl 2>"$OUT/llama-batched-bench.log" \
  | tee "$OUT/llama-batched-bench.jsonl" || status=1

fi
if [ "$PEERS" = 1 ]; then
section "transformers generate (bf16)"
timeout "$(budget 150 200)" python3 infra/hf_generate_bench.py --model "$MODEL" --batch "$BATCHES" \
  --pp "${PP:-700}" --tg "${TG:-160}" --repeats 1 --out "$OUT/transformers.json" || status=1

fi

section "quarry bench --device cuda:0"
# One run per batch size with at least that many documents (16 at least), until 150 seconds are
# left for the comparisons below; the JSON of every run goes into one file.
deadline=$(( END - ${AB_SECONDS:-150} ))
runs=()
for b in $(tr ',' ' ' <<<"$BATCHES"); do
  left=$(( deadline - $(date +%s) ))
  if [ "$left" -lt 20 ]; then
    echo "batch $b and larger: not run (the call's time is spent; raise CALL_SECONDS or pass fewer BATCHES)"
    break
  fi
  docs="${DOCS:-$(( b > 16 ? b : 16 ))}"
  timeout "$left" "$Q" bench --device cuda:0 --status "$STATUS" --batch "$b" --docs "$docs" \
    --modes "${MODES:-a,b,c}" --repeats "${REPEATS:-3}" --step-tokens 4096 --out "$STAGE_DIR/quarry-bench-$b.json"
  rc=$?
  [ $rc = 124 ] && echo "batch $b: stopped at the deadline"
  [ $rc = 0 ] && runs+=("$STAGE_DIR/quarry-bench-$b.json")
  [ $rc = 0 ] || [ $rc = 124 ] || status=1
done
merge_runs "$OUT/quarry-bench-cuda.json" "${runs[@]}"

# The kernel choices left to measurement, each against the defaults (the sweep's run of the same
# batch size), mode a: one run per setting in AB (space separated VAR=value[,VAR=value…][@BATCH],
# batch 128 unless given). Default, first: the old defaults (warps attention, no GEMM add, no
# RoPE store) at batch 1 and 8, where the defaults now take split-K attention and both fusions
# (steps of at most 16 tokens: 1.44x at batch 1 and 1.20x at 8 on an H200, 2026-11-28); split-K's
# combine in its own launch (QUARRY_SPLIT_COMBINE, opt-in, not yet measured) at batch 1; then all
# three at batch 32, just past the threshold; the attention's L2 prefetch of both pools' rows
# (QUARRY_ATTENTION_PREFETCH, opt-in, not yet measured) and its key rows staged through shared
# memory (QUARRY_ATTENTION_KEYS, the same) at batch 512; the steps' CUDA graphs off at batch 1 and 32, and
# the forward pass's phases timed (QUARRY_PROFILE, its table in the log) at batch 512. The
# settings measured before (QUARRY_ATTENTION=per-dimension or gather,
# QUARRY_SAMPLING=host, QUARRY_DENSE_FROM_ROWS, QUARRY_ADD_NORM, QUARRY_KV_DTYPE=bf16) run when
# AB names them; all into one JSON whose runs carry their setting.
OLD=QUARRY_ATTENTION=warps,QUARRY_GEMM_ADD=off,QUARRY_ROPE_STORE=off
ALL=QUARRY_ATTENTION=split,QUARRY_GEMM_ADD=on,QUARRY_ROPE_STORE=on
AB="${AB-$OLD@1 $OLD@8 QUARRY_SPLIT_COMBINE=on@1 $ALL@32 QUARRY_ATTENTION_PREFETCH=both@512 QUARRY_ATTENTION_KEYS=staged@512 QUARRY_CUDA_GRAPHS=off@32 QUARRY_ATTENTION=tiled@512 QUARRY_ATTENTION=cascade@512 QUARRY_PROFILE=1@512}"
if [ "$split_ok" = 0 ]; then
  AB="$(tr ' ' '\n' <<<"$AB" | grep -v '^QUARRY_ATTENTION=split' | paste -sd' ')"
fi
kept=()
for entry in $AB; do
  if failed="$(untested "$entry")"; then echo "$entry: not run ($failed did not pass its test)"; else kept+=("$entry"); fi
done
AB="${kept[*]}"
for fusion in "${failed_fusions[@]}"; do
  AB="$(tr ' ' '\n' <<<"$AB" | grep -v "QUARRY_$fusion=on" | paste -sd' ')"
done
ab_runs=()
n=0
for entry in $AB; do
  n=$((n + 1))
  setting="${entry%@*}"
  b=128
  [ "$entry" != "$setting" ] && b="${entry##*@}"
  docs=$(( b > 8 ? b : 8 ))  # at batch 1, 8 documents: compare its TPOT with the sweep's
  section "quarry bench with $setting, batch $b, mode a"
  left=$(( END - $(date +%s) - 5 ))
  [ "$left" -lt 20 ] && { echo "not run: the call's time is spent"; continue; }
  env $(tr ',' ' ' <<<"$setting") timeout "$(budget 40 5)" "$Q" bench --device cuda:0 --status "$STATUS" --batch "$b" \
    --docs "$docs" --modes a --step-tokens 4096 --out "$STAGE_DIR/quarry-bench-ab-$n.json" \
    && ab_runs+=("$setting=$STAGE_DIR/quarry-bench-ab-$n.json") || echo "(stopped or failed)"
done
merge_runs "$OUT/quarry-bench-ab.json" "${ab_runs[@]}"

# Records that always close (docs/budget.md) against the same engine with them off
# (`--no-budget`), modes b and c, at NO_BUDGET_BATCHES (default 32,512; empty: none): the records
# lost to max_tokens before, and what the budget costs.
nb_runs=()
for b in $(tr ',' ' ' <<<"${NO_BUDGET_BATCHES-32,512}"); do
  section "quarry bench --no-budget, batch $b, modes b and c"
  left=$(( END - $(date +%s) - 5 ))
  [ "$left" -lt 20 ] && { echo "not run: the call's time is spent"; continue; }
  timeout "$(budget 40 5)" "$Q" bench --device cuda:0 --status "$STATUS" --batch "$b" --docs "$b" \
    --modes b,c --step-tokens 4096 --no-budget --out "$STAGE_DIR/quarry-bench-nobudget-$b.json" \
    && nb_runs+=("$STAGE_DIR/quarry-bench-nobudget-$b.json") || echo "(stopped or failed)"
done
merge_runs "$OUT/quarry-bench-nobudget.json" "${nb_runs[@]}"

# The whole dataset job against the engine alone (pipeline-bench: the same documents and prompts,
# JSONL shards in, validation, Parquet out; both with the job's KV pool and pass sizes for the
# GPU) at PIPELINE_BATCHES (default none, e.g. 128,512), with PIPELINE_DOCS documents (default
# four times the batch, at most 600) in shards of one batch, TG output tokens at most, medians of
# 2; every store call takes PIPELINE_LATENCY_MS first (default 0; 20 is an object store's). On a
# GPU a step is a few milliseconds, so whatever the job does between steps shows here. With
# PIPELINE_KAFKA_PARTITIONS (e.g. 8) a Kafka worker runs instead, over a topic of that many
# partitions on librdkafka's in-process mock cluster, a file every batch of a partition.
for b in $(tr ',' ' ' <<<"${PIPELINE_BATCHES-}"); do
  section "pipeline-bench --device cuda:0, batch $b"
  left=$(( END - $(date +%s) - 5 ))
  [ "$left" -lt 30 ] && { echo "not run: the call's time is spent"; continue; }
  docs="${PIPELINE_DOCS:-$(( 4 * b ))}"
  [ "$docs" -gt 600 ] && docs=600
  timeout "$(budget 150 5)" "$PACK/bin/pipeline-bench" --pipeline pipelines/debian-packages.toml \
    --status "$STATUS" --model "$QUARRY_MODEL" --device cuda:0 --max-running "$b" \
    --max-tokens "${TG:-160}" --docs "$docs" --repeats 2 --threads "$(nproc)" \
    --shard-docs "$b" --store-latency-ms "${PIPELINE_LATENCY_MS:-0}" \
    --kafka-partitions "${PIPELINE_KAFKA_PARTITIONS:-0}" \
    --out "$OUT/pipeline-bench${PIPELINE_KAFKA_PARTITIONS:+-kafka}-$b.json" || echo "(stopped or failed)"
done

section "summary"
python3 - "$OUT" <<'EOF'
# Output tokens per second of wall time, prefill included, for all three (quarry's documents have
# prompts of about PP tokens and up to TG output tokens; the peers run exactly PP and TG), and the
# peers' decode-phase rate alone after the slash.
import json, os, sys
out = sys.argv[1]
rows = {}
def put(batch, key, value):
    rows.setdefault(int(batch), {})[key] = value
def lines(name):
    try:
        return [json.loads(l) for l in open(os.path.join(out, name)) if l.startswith("{")]
    except (OSError, ValueError) as e:
        print(f"{name}: {e}")
        return []
for r in lines("llama-batched-bench.jsonl") + lines("llama-batched-bench.log"):
    put(r["pl"], "llama.cpp", f"{r['pl'] * r['tg'] / r['t']:.0f} / {r['speed_tg']:.0f}")
try:
    for r in json.load(open(os.path.join(out, "transformers.json")))["results"]:
        if "output_tok_s" in r:
            put(r["batch"], "transformers", f"{r['output_tok_s']:.0f} / {r['decode_tok_s']:.0f}")
except (OSError, ValueError, KeyError) as e:
    print("transformers: no results", e)
for name in ["quarry-bench-cuda.json", "quarry-bench-ab.json"]:
    try:
        for r in json.load(open(os.path.join(out, name)))["results"]:
            m = r["median"]
            # TPOT: a step's time (with CUDA graphs the forward call returns at the launch and
            # the draw waits for the GPU, so the forward call's own time says little).
            ms = m["tpot_ms"]
            label = f" {r['env']}" if "env" in r else ""
            put(r["batch"], f"quarry {r['mode']}{label}", f"{m['output_tokens_per_s']:.0f} ({ms:.1f} ms)")
    except (OSError, ValueError, KeyError) as e:
        print(f"{name}: no results", e)
cols = sorted({k for r in rows.values() for k in r})
print("output tokens/s over wall time (peers: / decode phase only; quarry: (TPOT ms)), by batch size")
print(f"{'batch':>6} " + " ".join(f"{c:>16}" for c in cols))
for b in sorted(rows):
    print(f"{b:>6} " + " ".join(f"{rows[b].get(c, '-'):>16}" for c in cols))
# Constrained against free: documents per second by mode (c / a is the target: at least 1 at
# every batch size), records cut at max_tokens, the share of passes that replayed a CUDA graph,
# the masks' wait after the forward call and the host's own time per pass.
try:
    res = json.load(open(os.path.join(out, "quarry-bench-cuda.json")))["results"]
    docs = {(r["batch"], r["mode"]): r["median"]["docs_per_s"] for r in res}
    print("batch mode   docs/s   c/a   cut closed  graphs  mask wait µs  host ms/pass")
    for r in res:
        m, g = r["median"], r.get("cuda_graphs", {})
        a = docs.get((r["batch"], "a"))
        ratio = f"{m['docs_per_s'] / a:5.2f}" if a else "    -"
        host = 1e3 * m.get("host_s", 0) / max(m["forward_passes"], 1)
        print(f"{r['batch']:>5} {r['mode']:>4} {m['docs_per_s']:>8.1f} {ratio} {m.get('cut_at_max_tokens', '-'):>5} {m.get('budget_closed', '-'):>6}"
              f" {100 * g.get('replay_share', 0):>6.1f}% {m.get('mask_wait_us_per_step', 0):>13.0f} {host:>13.2f}")
except (OSError, ValueError, KeyError) as e:
    print("quarry-bench-cuda.json: no results", e)
EOF
exit $status
