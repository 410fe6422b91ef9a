#!/usr/bin/env bash
# The Debian package end to end (ctest package:deb): cpack makes the .deb from BUILD_DIR,
# dpkg-deb -x unpacks it into a throwaway root, and the unpacked kvlens-cli (and kvlens, when the
# app is built) run from an unrelated folder and find the bundled files in root/usr/share/kvlens.
#   test_deb.sh BUILD_DIR [--app]   (--app: the build has the kvlens app; exit 4: skipped, no
#   dpkg-deb or cpack)
set -euo pipefail
build=$(cd "$1" && pwd)
with_app=${2:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v dpkg-deb >/dev/null || { echo "package:deb skipped: no dpkg-deb"; exit 4; }
cpack=$(dirname "$(command -v cmake)")/cpack
[ -x "$cpack" ] || cpack=$(command -v cpack) || { echo "package:deb skipped: no cpack"; exit 4; }
# Outside the build tree, so the build tree's fallback on the source assets cannot apply.
work=$(mktemp -d "${TMPDIR:-/tmp}/kvlens-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT

"$cpack" --config "$build/CPackConfig.cmake" -B "$work/out" >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log" >&2; exit 1; }
deb=$(find "$work/out" -maxdepth 1 -name 'kvlens_*.deb' | head -n 1)
[ -n "$deb" ] || { echo "cpack made no kvlens_*.deb" >&2; cat "$work/cpack.log" >&2; exit 1; }
echo "== $(basename "$deb")"
dpkg-deb --info "$deb" | sed -n '/Package:/,$p'
root="$work/root"
dpkg-deb -x "$deb" "$root"

share="$root/usr/share/kvlens"
for file in usr/bin/kvlens-cli usr/share/kvlens/benchmarks/coref/pools.json \
  usr/share/kvlens/models/demo/config.json usr/share/kvlens/models/demo/model.safetensors \
  usr/share/kvlens/models/demo/tokenizer.json usr/share/kvlens/models/demo/predictor.safetensors; do
  [ -f "$root/$file" ] || { echo "the package lacks /$file" >&2; exit 1; }
done
app=
if [ "$with_app" = --app ]; then
  for file in usr/bin/kvlens usr/share/applications/kvlens.desktop \
    usr/share/icons/hicolor/scalable/apps/kvlens.svg; do
    [ -f "$root/$file" ] || { echo "the package lacks /$file" >&2; exit 1; }
  done
  grep -q '^Icon=kvlens$' "$root/usr/share/applications/kvlens.desktop"
  app=--app
else
  echo "(no kvlens app in this build: its part is skipped)"
fi
"$here/check_installed.sh" "$root/usr/bin" "$share/models/demo" $app
# The Python module, where Debian's python3 finds it (built with KVLENS_PYTHON): it opens the
# package's demo model from the package's own share/kvlens.
python_dir="$root/usr/lib/python3/dist-packages/kvlens"
if [ -d "$python_dir" ] && [ -x /usr/bin/python3 ]; then
  echo "== kvlens Python module ($python_dir)"
  (cd "$work" && env -u KVLENS_ASSETS_DIR PYTHONPATH="$root/usr/lib/python3/dist-packages" \
    /usr/bin/python3 -c '
import os, sys, kvlens
assert kvlens.__file__.startswith(sys.argv[1]), kvlens.__file__
assert kvlens.demo_model().startswith(sys.argv[2]), kvlens.demo_model()
rows = kvlens.eval_coref(kvlens.Model(kvlens.demo_model()), "h2o", sparsity=0.5, samples=2)
print("module from the package: demo model", kvlens.demo_model(), "h2o accuracy", rows[0]["accuracy"])
' "$root/usr/lib/python3/dist-packages" "$root/usr/share/kvlens")
fi
if [ -d "$python_dir" ]; then
  # --policy-file in the package's kvlens-cli: its embedded interpreter takes the package's module.
  listing=$("$root/usr/bin/kvlens-cli" policies --policy-file "$here/../../examples/policies/tova.py")
  echo "$listing" | grep -q "^tova_py " || { echo "kvlens-cli --policy-file: no tova_py" >&2; exit 1; }
  echo "kvlens-cli --policy-file from the package: tova_py registered"
fi
