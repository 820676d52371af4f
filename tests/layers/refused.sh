#!/usr/bin/env bash
# Every sideways include is refused by the compiler: each case below is a
# file of one layer including another layer's private header, compiled
# with that layer's defines (as CMake compiles the layer's sources); it
# must fail with the header's own #error line. A few allowed includes are
# compiled too and must succeed, so the refusals are not a broken setup.
#
#   tests/layers/refused.sh CC SOURCE_DIR
set -u
cc=${1:?compiler} src=${2:?source dir}
fail=0

# try LAYER_DEFINES HEADER WANT (refused|ok)
try() {
  local defs=$1 hdr=$2 want=$3 out rc
  out=$(printf '#include "%s"\nint kvf_layers_probe;\n' "$hdr" |
    "$cc" -std=gnu11 -D_GNU_SOURCE $defs -I"$src" -I"$src/include" \
      -fsyntax-only -x c - 2>&1)
  rc=$?
  if [ "$want" = refused ]; then
    if [ $rc -ne 0 ] && printf '%s' "$out" | grep -q "#error"; then
      echo "refused  ($defs) $hdr"
    else
      echo "NOT REFUSED ($defs) $hdr"; fail=1
    fi
  else
    if [ $rc -eq 0 ]; then
      echo "allowed  ($defs) $hdr"
    else
      echo "NOT ALLOWED ($defs) $hdr: $out" | head -3; fail=1
    fi
  fi
}

store="-DKVF_INTERNAL -DKVF_LAYER_STORE"
tr="-DKVF_INTERNAL -DKVF_LAYER_TRANSPORT"
eng="-DKVF_INTERNAL -DKVF_LAYER_ENGINE"
tools="-DKVF_INTERNAL -DKVF_LAYER_TOOLS"

# the reaches of the review (store -> engine, transport -> mem/cuda)
try "$store" engine/engine_int.h refused
try "$store" engine/meta.h refused
try "$store" transport/transport.h refused
try "$store" mem/mem.h refused
try "$tr" mem/cuda/cuda.h refused
try "$tr" mem/cuda/xxh3.h refused
try "$eng" mem/cuda/cuda.h refused
try "$eng" transport/shm/shm.h refused
# tools: core's interface, nothing below it
try "$tools" engine/engine_int.h refused
try "$tools" store/proto/msg.h refused
try "$tools" transport/transport.h refused
# upward: a lower layer never includes a higher one's headers
try "$tr" engine/engine_int.h refused
try "-DKVF_INTERNAL -DKVF_LAYER_MEM" transport/transport.h refused
try "-DKVF_INTERNAL -DKVF_LAYER_CORE" store/master/master_int.h refused
# outside the library (examples, other programs): public headers only
try "" core/log.h refused
try "" store/client/client_int.h refused

# what is allowed stays allowed
try "$store" kvferry/view.h ok
try "$store" core/wire.h ok
try "$store" coord/etcd.h ok
try "$tr" mem/gpu.h ok
try "$tr" mem/mem.h ok
try "$eng" transport/transport.h ok
try "$tools" core/time.h ok
try "" kvferry/kvferry.h ok

exit $fail
