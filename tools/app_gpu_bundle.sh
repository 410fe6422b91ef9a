#!/usr/bin/env bash
# Builds .carry/app-gpu/ and .carry/app-gpu.tar.xz: the Qt+CUDA kvlens from BUILD (default
# /tmp/qt-cuda-build) with every shared library it and the offscreen platform plugin need except
# glibc (kept apart in glibc/, used only where the machine's glibc is too old) and CUDA's own
# (libcudart, libcublas, libcublasLt: the GPU machine has them). Run from the repo root.
set -euo pipefail
build=${1:-/tmp/qt-cuda-build}
dest=.carry/app-gpu
qtplugins=/usr/lib/x86_64-linux-gnu/qt6/plugins
rm -rf "$dest" && mkdir -p "$dest"/{lib,gcc,glibc,plugins/platforms,fonts}
cp "$build/app/kvlens" "$dest/kvlens" && strip "$dest/kvlens"
cp "$qtplugins/platforms/libqoffscreen.so" "$dest/plugins/platforms/"
glibc_re='/(libc|libm|libpthread|libdl|librt|libresolv|libutil)\.so|/ld-linux'
cuda_re='libcuda|libcudart|libcublas|libnvidia|libnvrtc'
ldd "$build/app/kvlens" "$qtplugins/platforms/libqoffscreen.so" | awk '/=> \//{print $3}' | sort -u |
  while read -r lib; do
    name=$(basename "$lib")
    if [[ $lib =~ $cuda_re ]]; then echo "  left out (CUDA, on the GPU machine): $name" >&2
    elif [[ $lib =~ $glibc_re ]]; then cp -L "$lib" "$dest/glibc/$name"
    elif [[ $name == libstdc++.so.6 || $name == libgcc_s.so.1 ]]; then cp -L "$lib" "$dest/gcc/$name"
    else cp -L "$lib" "$dest/lib/$name"; fi
  done
# libGL (glvnd) for completeness; the offscreen dashboard paints with QPainter, no GL context.
cp -L /usr/lib/x86_64-linux-gnu/libGL.so.1 "$dest/lib/"
cp -L /lib64/ld-linux-x86-64.so.2 "$dest/glibc/"
strip --strip-unneeded "$dest"/lib/*.so* "$dest"/plugins/platforms/*.so 2>/dev/null || true
cp /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf /usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf \
  "$dest/fonts/"
cat > "$dest/fonts/fonts.conf" <<'CONF'
<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "urn:fontconfig:fonts.dtd">
<fontconfig>
  <dir>/tmp/app-gpu/fonts</dir>
  <cachedir>/tmp/app-gpu/fontcache</cachedir>
</fontconfig>
CONF
# Qt's plugins from the bundle only, not its built-in /usr/lib/x86_64-linux-gnu/qt6/plugins (glibc/
# too: run through the bundled loader, the application's folder is that of ld-linux).
printf '[Paths]\nPrefix = /tmp/app-gpu\nPlugins = /tmp/app-gpu/plugins\n' | tee "$dest/qt.conf" > "$dest/glibc/qt.conf"
# The Llama 3 vocabulary (128256 ids) for the 1B-shaped random checkpoint, which has none.
cp ../shared/data/tokenizers/llama3-tokenizer.json.gz "$dest/"
# The newest glibc symbol version each part needs (the script compares it with the machine's).
need() { objdump -T "$@" 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*' | sort -uV | tail -1 | cut -d_ -f2; }
echo "$(need "$dest/kvlens" "$dest"/lib/*.so* "$dest"/plugins/platforms/*.so)" > "$dest/GLIBC_NEEDED"
echo "$(need "$dest"/gcc/*)" > "$dest/GLIBC_NEEDED_GCC"
strings "$dest/gcc/libstdc++.so.6" | grep '^GLIBCXX_3\.4\.[0-9]*$' | sort -V | tail -1 > "$dest/GLIBCXX_BUNDLED"
objdump -T "$dest/kvlens" "$dest"/lib/*.so* | grep -o 'GLIBCXX_3\.4\.[0-9]*' | sort -uV | tail -1 > "$dest/GLIBCXX_NEEDED"
(cd "$dest" && sha256sum kvlens > kvlens.sha256)
echo "kvlens from $(git rev-parse --short HEAD)$(git status --short -uno | grep -q . && echo ' + uncommitted changes'), built $(date -r "$build/app/kvlens" '+%F %T')" > "$dest/BUILD_INFO"
tar -C .carry -cf - app-gpu | xz -9e -T2 > .carry/app-gpu.tar.xz
du -sh "$dest" && ls -l .carry/app-gpu.tar.xz
