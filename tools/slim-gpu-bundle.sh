#!/usr/bin/env bash
# Shrink .gpu/triton38-utlx.tar.xz (from ../shared/tools/gpu-bundle) to what the H200 runs need,
# so that it and the tracked tree stay under the device's 64 MiB carry limit: session 28 found
# the tree (12.5 MB in 4 KB blocks) plus the 55.5 MB bundle over it ("the working tree is larger
# than 64 MiB"). Dropped: nvdisasm (SASS dumps on the device; compile_check --loops runs here),
# CUPTI headers, the instrumentation and plugin test libraries, FileCheck and the TLX tutorials:
# 55.5 -> ~51 MB. Keep triton/backends/amd: Triton's plugin loading imports it (without it
# pytest's jagflash plugin fails with "No module named 'triton.backends.amd'").
#   bash tools/slim-gpu-bundle.sh [.gpu/triton38-utlx.tar.xz]   (the full one is kept as *.full)
set -euo pipefail
bundle=${1:-.gpu/triton38-utlx.tar.xz}
[ -f "$bundle" ] || { echo "slim-gpu-bundle: no $bundle (run ../shared/tools/gpu-bundle first)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xJf "$bundle" -C "$work"
rm -rf "$work"/triton/backends/nvidia/bin/nvdisasm "$work"/triton/backends/nvidia/include/cupti*.h \
    "$work"/triton/instrumentation/libGPUInstrumentationTestLib.so "$work"/triton/plugins/libTritonPluginsTestLib.so \
    "$work"/triton/FileCheck "$work"/tlx/tutorials
[ -d "$work"/triton/backends/amd ] || { echo "slim-gpu-bundle: the bundle has no triton/backends/amd" >&2; exit 1; }
[ -f "$bundle.full" ] || cp "$bundle" "$bundle.full"
tar -C "$work" -cf - . | xz -T2 -6 > "$bundle.tmp"
mv "$bundle.tmp" "$bundle"
ls -l "$bundle"
