#!/usr/bin/env bash
# ./run demo: kdm end to end with real processes, as a user runs it.
#
#   1. `kdm kubelet` in a fresh temporary directory;
#   2. `kdm plugin`: an 8-GPU DGX-1 V100 (hybrid cube-mesh NVLink, packed
#      policy: GetPreferredAllocation answered by the optimal allocator) and
#      4 FPGAs (example.com/fpga);
#   3. pods written as manifests: 2, 4 (after an init container) , 1 and 1
#      GPUs are admitted, a fifth is rejected with the kubelet's message; for
#      each the GPUs chosen, their link score, and first-fit's pick;
#   4. SIGKILL the kubelet, start it again: every allocation is recovered and
#      both plugins register again;
#   5. one GPU marked unhealthy through the plugin's health file: allocatable
#      drops;
#   6. a summary table.
# Exits non-zero if any step misbehaves; cleans up after itself.
# Usage: scripts/demo.sh <build dir> [--keep]
# (The in-process version of this story is examples/node_demo.cc.)
set -euo pipefail

build=${1:-build}
keep=${2:-}
kdm="$(cd "$build" && pwd)/bin/kdm"
[[ -x "$kdm" ]] || { echo "demo: $kdm not built" >&2; exit 1; }

root=$(mktemp -d /tmp/kdm-demo-XXXXXX)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [[ "$keep" == "--keep" ]]; then echo "(kept $root)"; else rm -rf "$root"; fi
}
trap cleanup EXIT
trap 'fail "line $LINENO: $BASH_COMMAND"' ERR

started=$SECONDS
fail() { echo "  !! FAILED: $*" >&2; echo "  (logs in $root/*.log)" >&2; keep=--keep; exit 1; }

# JSON from files and kdm, read with python3 (on every machine ./run targets).
py() { python3 -c "$1" "${@:2}"; }
# Value of a python expression over the JSON in file $1 (as j).
jq_file() { py "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"; }

# Bounded wait: wait_for <what> <seconds> <command...>
wait_for() {
  local what=$1 bound=$2; shift 2
  local end=$((SECONDS + bound))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || fail "timed out waiting for $what"
    sleep 0.05
  done
}

allocatable_is() { [[ "$(jq_file "$root/status/node.json" "j['allocatable'].get('$1')")" == "$2" ]]; }
phase_is() { [[ "$(jq_file "$root/status/$1.json" "j['phase']")" == "$2" ]]; }
log_has() { grep -q -- "$2" "$root/$1"; }

start_kubelet() {
  "$kdm" kubelet --root "$root" --grace 1m >>"$root/kubelet.log" 2>&1 &
  kubelet_pid=$!
  pids+=("$kubelet_pid")
}

echo "== kdm demo in $root"
start_kubelet
wait_for "kubelet" 10 test -f "$root/status/node.json"
echo "{}" >"$root/health.json"
"$kdm" plugin --root "$root" --resource nvidia.com/gpu --preset dgx1-v100 --policy packed \
  --health-file "$root/health.json" >>"$root/gpu-plugin.log" 2>&1 &
pids+=($!)
"$kdm" plugin --root "$root" --resource example.com/fpga --count 4 >>"$root/fpga-plugin.log" 2>&1 &
pids+=($!)
wait_for "8 GPUs allocatable" 10 allocatable_is nvidia.com/gpu 8
wait_for "4 FPGAs allocatable" 10 allocatable_is example.com/fpga 4
echo "-- kubelet up, plugins registered: nvidia.com/gpu=8 (dgx1-v100, packed), example.com/fpga=4"

all_gpus="GPU0 GPU1 GPU2 GPU3 GPU4 GPU5 GPU6 GPU7"
declare -A chosen score ff ff_score result
used=""

# GPUs of app container "main" in a status file, comma-separated.
gpus_of() { jq_file "$root/status/$1.json" "','.join(d for c in j['containers'] if c['name']=='main' for d in c['devices'].get('nvidia.com/gpu',[]))"; }
free_gpus() {
  local g out=""
  for g in $all_gpus; do [[ ",$used," == *",$g,"* ]] || out+="${out:+,}$g"; done
  echo "$out"
}

admit() {  # admit <name> <gpus> <expect Admitted|Rejected> <manifest text>
  local name=$1 n=$2 expect=$3 text=$4 free
  free=$(free_gpus)
  printf '%s' "$text" >"$root/manifests/.$name.tmp"
  mv "$root/manifests/.$name.tmp" "$root/manifests/$name.yaml"
  wait_for "status of $name" 10 test -f "$root/status/default_$name.json"
  wait_for "$name $expect" 5 phase_is "default_$name" "$expect"
  result[$name]=$expect
  if [[ "$expect" == Rejected ]]; then
    echo "   $name ($n GPUs): Rejected: $(jq_file "$root/status/default_$name.json" "j['reason']+': '+j['message']")"
    return
  fi
  chosen[$name]=$(gpus_of "default_$name")
  [[ $(tr ',' '\n' <<<"${chosen[$name]}" | wc -l) -eq $n ]] || fail "$name got ${chosen[$name]}, not $n GPUs"
  score[$name]=$("$kdm" topo --preset dgx1-v100 --size "$n" --available "${chosen[$name]}" --json |
    py "import json,sys; print(json.load(sys.stdin)['score'])")
  local ffj
  ffj=$("$kdm" topo --preset dgx1-v100 --size "$n" --available "$free" --policy first-fit --json)
  ff[$name]=$(py "import json,sys; print(','.join(json.loads(sys.argv[1])['ids']))" "$ffj")
  ff_score[$name]=$(py "import json,sys; print(json.loads(sys.argv[1])['score'])" "$ffj")
  ((score[$name] >= ff_score[$name])) || fail "$name: packed score ${score[$name]} < first-fit ${ff_score[$name]}"
  used+="${used:+,}$(jq_file "$root/status/default_$name.json" "','.join(sorted({d for c in j['containers'] for d in c['devices'].get('nvidia.com/gpu',[])}))")"
  printf '   %-8s %d GPUs -> %-24s link score %4s   first-fit: %-24s score %4s\n' \
    "$name" "$n" "{${chosen[$name]}}" "${score[$name]}" "{${ff[$name]}}" "${ff_score[$name]}"
}

pod() {  # pod <name> <gpus> [init gpus] [fpgas]
  local s="apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
"
  if [[ -n "${3:-}" ]]; then
    s+="  initContainers:
  - name: fetch
    resources: {limits: {nvidia.com/gpu: $3}}
"
  fi
  s+="  containers:
  - name: main
    resources:
      limits: {nvidia.com/gpu: $2${4:+, example.com/fpga: $4}}
"
  printf '%s' "$s"
}

echo "-- admitting pods (GPUs chosen by the plugin's packed policy vs first-fit)"
admit train-a 2 Admitted "$(pod train-a 2)"
admit train-b 4 Admitted "$(pod train-b 4 1 1)"
admit infer-c 1 Admitted "$(pod infer-c 1)"
admit infer-d 1 Admitted "$(pod infer-d 1)"
admit too-big 2 Rejected "$(pod too-big 2)"
init_gpu=$(jq_file "$root/status/default_train-b.json" "','.join(j['containers'][0]['devices']['nvidia.com/gpu'])")
[[ ",${chosen[train-b]}," == *",$init_gpu,"* ]] || fail "train-b's init GPU $init_gpu not reused by main"
echo "   train-b's init container used $init_gpu, handed on to its app container"
[[ "$(jq_file "$root/status/default_too-big.json" "j['message']")" == \
  "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. Requested: 2, Available: 0, which is unexpected" ]] ||
  fail "too-big's message"

echo "-- kdm publish --dry-run: the node's kdm.io/devices annotation (every GPU is held now)"
annotation=$("$kdm" publish --node-name demo-node --pod-resources-socket "$root/pod-resources/kubelet.sock" \
  --topology nvidia.com/gpu=preset:dgx1-v100 --dry-run) || fail "kdm publish --dry-run"
published=$(py "import json,sys; r=json.loads(sys.argv[1])['resources']; print(len(r['nvidia.com/gpu']['devices']), len(r['nvidia.com/gpu']['available']), len(r['example.com/fpga']['available']))" "$annotation")
[[ "$published" == "8 0 3" ]] || fail "published devices/available: $published, expected 8 GPUs, 0 free, 3 free FPGAs"
echo "   ${annotation:0:160}..."

echo "-- SIGKILL the kubelet, start it again on the same --root"
kill -KILL "$kubelet_pid"
wait "$kubelet_pid" 2>/dev/null || true
: >"$root/kubelet.log"
rm -f "$root/status/node.json"  # so that what follows is the new agent's view
start_kubelet
for name in train-a train-b infer-c infer-d; do
  wait_for "$name recovered" 15 log_has kubelet.log "event=pod_admitted file=\"$name.yaml\" .*recovered=true"
  [[ "$(gpus_of "default_$name")" == "${chosen[$name]}" ]] || fail "$name recovered other GPUs"
  echo "   $name recovered {${chosen[$name]}}"
done
wait_for "GPU plugin registered again" 10 allocatable_is nvidia.com/gpu 8
wait_for "FPGA plugin registered again" 10 allocatable_is example.com/fpga 4
echo "   plugins registered again: $(jq_file "$root/status/node.json" \
  "', '.join(p['resource']+' '+p['state']+' '+str(p['healthy'])+'/'+str(p['devices']) for p in j['plugins'])")"
log_has kubelet.log "event=pod_still_rejected file=\"too-big.yaml\"" || fail "too-big not kept rejected"
echo "   too-big stays rejected until its manifest changes"

echo "-- GPU3 turns unhealthy (plugin health file)"
echo '{"GPU3": "Unhealthy"}' >"$root/health.json"
wait_for "allocatable 7" 10 allocatable_is nvidia.com/gpu 7
echo "   nvidia.com/gpu capacity $(jq_file "$root/status/node.json" "j['capacity']['nvidia.com/gpu']"), allocatable 7"

echo "-- summary"
printf '   %-8s %-9s %-24s %6s   %-24s %6s\n' POD RESULT GPUS SCORE FIRST-FIT SCORE
for name in train-a train-b infer-c infer-d too-big; do
  printf '   %-8s %-9s %-24s %6s   %-24s %6s\n' "$name" "${result[$name]}" \
    "{${chosen[$name]:-}}" "${score[$name]:--}" "{${ff[$name]:-}}" "${ff_score[$name]:--}"
done
echo "== demo passed in $((SECONDS - started)) s"
