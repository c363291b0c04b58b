#!/usr/bin/env bash
# Installs the kdm build tree into a temporary prefix, then builds and runs a
# ten-line consumer project with find_package(kdm CONFIG), builds kdm's
# conformance/ sources against the installed headers alone, and links the same
# consumer a second time with nothing but `pkg-config --cflags/--libs --static kdm`.
# Usage: install_test.sh <kdm build dir> <consumer source dir> [compiler flags]
#        [conformance source dir]
# The consumers are compiled with $CXX (default c++).
set -euo pipefail
build=$1
consumer=$2
flags=${3:-}
conformance=${4:-}
work=$(mktemp -d /tmp/kdm-install-XXXXXX)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/lib/cmake/kdm/kdmConfig.cmake"
test -f "$work/prefix/lib/cmake/kdm/kdmConfigVersion.cmake"
test -x "$work/prefix/bin/kdm"

cmake -S "$consumer" -B "$work/consumer-build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >/dev/null
cmake --build "$work/consumer-build" >/dev/null
out=$("$work/consumer-build/consumer")
echo "consumer printed: $out"
case "$out" in
  "v1beta1 plugin options: resource_name is empty manager=1 pick=0,3") ;;
  *) echo "unexpected consumer output"; exit 1 ;;
esac

# conformance/ needs no header that kdm does not install.
if [ -n "$conformance" ]; then
  here=$(cd "$(dirname "$0")" && pwd)
  cmake -S "$here/conformance" -B "$work/conformance-build" -G Ninja \
    -DCMAKE_PREFIX_PATH="$work/prefix" -DKDM_CONFORMANCE_DIR="$conformance" \
    -DCMAKE_CXX_FLAGS="$flags" >/dev/null
  if ! cmake --build "$work/conformance-build" >"$work/conformance.log" 2>&1; then
    cat "$work/conformance.log"
    echo "conformance/ does not build against the installed kdm headers"
    exit 1
  fi
  echo "conformance/ built against the installed headers"
fi

# pkg-config sees the same package.
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
pkg-config --exists kdm
pkg-config --modversion kdm
cflags=$(pkg-config --cflags kdm)
libs=$(pkg-config --libs --static kdm)
echo "kdm.pc: $cflags $libs"
for lib in -lkdm_pluginapi -lkdm_pluginapi_proto -lkdm_base; do
  case " $libs " in *" $lib "*) ;; *) echo "kdm.pc lacks $lib"; exit 1 ;; esac
done
# Every archive kdm installs is named, so a consumer that links them all
# finds every symbol they need.
for archive in "$work"/prefix/lib/libkdm_*.a; do
  lib=$(basename "$archive" .a)
  case " $libs " in *" -l${lib#lib} "*) ;; *) echo "kdm.pc lacks -l${lib#lib}"; exit 1 ;; esac
done
# The kube-apiserver client's archive calls into OpenSSL: kdm.pc must say so.
if [ -f "$work/prefix/lib/libkdm_kube.a" ]; then
  case " $(pkg-config --print-requires-private kdm | tr '\n' ' ') " in
    *" openssl "*) ;;
    *) echo "kdm.pc installs libkdm_kube but lacks openssl in Requires.private"; exit 1 ;;
  esac
  case " $libs " in *" -lssl "*) ;; *) echo "kdm.pc --static lacks -lssl"; exit 1 ;; esac
fi
# shellcheck disable=SC2086 # word splitting of the flags is the point
if ! "${CXX:-c++}" -std=c++20 $flags $cflags "$consumer/main.cc" -o "$work/pc-consumer" $flags $libs \
  >"$work/pc.log" 2>&1; then
  cat "$work/pc.log"
  echo "a consumer linked with pkg-config --libs --static kdm does not link"
  exit 1
fi
out=$("$work/pc-consumer")
case "$out" in
  "v1beta1 plugin options: resource_name is empty manager=1 pick=0,3") ;;
  *) echo "unexpected output from the pkg-config consumer: $out"; exit 1 ;;
esac
echo "pkg-config consumer printed: $out"
echo "install test passed"
