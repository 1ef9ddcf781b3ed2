#!/usr/bin/env bash
# //deploy:podman_run_test: the image and the local overlay, for real.
#
#   1. builds the image (deploy/image/build.sh --bin: the binaries Bazel built
#      for this test) as localhost/pdserve:podman-test and prints its size;
#   2. writes a tiny random model (pd-make-tiny-model) as model.gguf in a
#      folder of its own, renders deploy/k8s/overlays/local with it, the test
#      image, and on the decode workers a token delay (so streams last a few
#      seconds) and a 1 s drain deadline (so a stopped worker hands its
#      streams back and the router migrates them);
#   3. `podman kube play`: router, prefill and two decode pods; the `openai`
#      client's first streamed answer, timed from kube play (printed);
#   4. six concurrent streams; when each has received tokens, `podman pod
#      stop -t 45` of the decode pod running more of them (SIGTERM, drain,
#      hand-over; it must hand at least one stream back): every stream must
#      still end with all its tokens, and the stopped worker must exit 0;
#   5. every pod stopped gracefully (podman 4.3's `kube down` SIGKILLs, so
#      pods are stopped first), each container's exit code must be 0, then
#      `podman kube down` removes them.
# Every wait has a deadline; the pods, the flags volume and the test image
# are removed on every exit. Skipped when the binaries are sanitizer builds
# (--config=asan: the container has no sanitizer runtime settings) or the
# Python venv is missing ($PDSERVE_PYTHON unset).
#
# Args: build.sh containers.conf pd-make-tiny-model then the binaries.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/test_skip.sh"
build_sh=$1 containers_conf=$2 make_tiny=$3
shift 3
binaries=("$@")

# (Not `ldd | grep -q`: with pipefail, grep's early exit fails the pipe.)
if [[ "$(ldd "${binaries[0]}")" == *libasan* ]]; then
  skip_test podman_run_test "sanitizer build (--config=asan); runs in the default pass"
fi
[ -n "${PDSERVE_PYTHON:-}" ] || skip_test podman_run_test "PDSERVE_PYTHON unset (source scripts/python_env.sh)"
[ "$(id -u)" -eq 0 ] || skip_test podman_run_test "needs root for podman on this machine kind"
command -v podman >/dev/null || { echo "FAIL: podman missing (scripts/setup.sh installs it)"; exit 1; }

export CONTAINERS_CONF="$(readlink -f "$containers_conf")"
# Bazel runs tests without HOME; lib.sh and podman read it.
export HOME="${HOME:-${TEST_TMPDIR:-/tmp}}"
tag=localhost/pdserve:podman-test
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/podman_run.XXXXXX")
yaml="$work/pdserve-local.yaml"
pods=(pd-router-pod-0 pd-prefill-pod-0 pd-decode-pod-0 pd-decode-b-pod-0)
base_url=http://127.0.0.1:18000/v1

log() { printf '[%s] %s\n' "$(date +%T)" "$*"; }
cleanup() {
  local rc=$?
  set +e
  if [ $rc -ne 0 ]; then
    for p in "${pods[@]}"; do
      for c in $(podman pod inspect "$p" --format '{{range .Containers}}{{.Name}} {{end}}' 2>/dev/null); do
        [[ $c == *-infra ]] && continue
        echo "---- logs of $c"; podman logs "$c" 2>&1 | tail -25
      done
    done
  fi
  [ -f "$yaml" ] && timeout 60 podman kube down "$yaml" >/dev/null 2>&1
  for p in "${pods[@]}"; do timeout 60 podman pod rm -f "$p" >/dev/null 2>&1; done
  podman volume rm -f pdserve-flags >/dev/null 2>&1
  podman rmi -f "$tag" >/dev/null 2>&1
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT

# Leftovers of an interrupted run would hold the names and the ports.
for p in "${pods[@]}"; do podman pod rm -f "$p" >/dev/null 2>&1 || true; done
podman volume rm -f pdserve-flags >/dev/null 2>&1 || true
for port in 18000 18050 18051 18060 18061 18070 18071 18072 18073; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "FAIL: port $port is taken; the local overlay needs 18000-18073"; exit 1
  fi
done

log "building the image"
build_args=()
for b in "${binaries[@]}"; do build_args+=(--bin "$b"); done
build_out=$(timeout 300 bash "$build_sh" --tag "$tag" "${build_args[@]}")
echo "$build_out" | tail -3
size=$(echo "$build_out" | sed -n 's/^IMAGE_SIZE_BYTES=//p')
[ -n "$size" ] || { echo "FAIL: build.sh reported no size"; exit 1; }

log "read-only root: pd-generate answers in the image"
mkdir -p "$work/models"
"$make_tiny" --out "$work/models/model.gguf" >/dev/null
chmod -R a+rX "$work"
gen=$(timeout 120 podman run --rm --read-only --network none \
  -v "$work/models:/models:ro" "$tag" \
  pd-generate --model /models/model.gguf --prompt hello --max_tokens 4 --threads 1)
echo "pd-generate: $gen"

log "rendering the local overlay"
cp -rL "$here/k8s" "$work/k8s"
kubectl kustomize "$work/k8s/overlays/local" >"$work/rendered.yaml"
# The control plane's token, as the Secret would hold it (readable by the
# image's uid 10001).
mkdir -p "$work/secrets"
head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$work/secrets/token"
chmod 0755 "$work/secrets"
chmod 0444 "$work/secrets/token"
"$PDSERVE_PYTHON" - "$work/rendered.yaml" "$yaml" "$work/models" "$tag" "$work/secrets" <<'PY'
import sys, yaml
src, dst, models, tag, secrets = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(src)) if d]
for d in docs:
    if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "pdserve-flags":
        for key in ("decode.flags", "decode-b.flags"):
            flags = d["data"][key].replace("--drain_timeout_ms=30000\n", "")
            d["data"][key] = flags + "--testing_token_delay_us=40000\n--drain_timeout_ms=1000\n"
    if d["kind"] == "Deployment":
        spec = d["spec"]["template"]["spec"]
        for c in spec["containers"]:
            assert c["image"] == "localhost/pdserve:dev", c["image"]
            c["image"] = tag
        for v in spec["volumes"]:
            if v["name"] == "model":
                v["hostPath"]["path"] = models
            if v["name"] == "cluster-token":
                v["hostPath"]["path"] = secrets
yaml.safe_dump_all(docs, open(dst, "w"))
PY

log "podman kube play"
since=$(date +%s.%N)
timeout 120 podman kube play "$yaml" >/dev/null
first=$(timeout 150 "$PDSERVE_PYTHON" "$here/podman_stream_client.py" first \
  --base_url "$base_url" --since "$since" --deadline 120)
echo "first answer: $first"

# Every pod presents the token (the workers registered, so the router took
# theirs); a caller without it is refused and changes nothing.
pdctl=${binaries[4]}
[[ $pdctl == */pdctl ]] || { echo "FAIL: binaries[4] is not pdctl: $pdctl"; exit 1; }
if refused=$(env -u PDSERVE_CLUSTER_TOKEN_FILE "$pdctl" status --router=127.0.0.1:18051 2>&1); then
  echo "FAIL: pdctl status without the token was answered: $refused"; exit 1
fi
grep -q UNAUTHENTICATED <<<"$refused" || { echo "FAIL: expected UNAUTHENTICATED: $refused"; exit 1; }
"$pdctl" status --router=127.0.0.1:18051 --cluster_token_file="$work/secrets/token" >/dev/null ||
  { echo "FAIL: pdctl status with the token failed"; exit 1; }
echo "control plane: without the token UNAUTHENTICATED, with it answered"

log "waiting for both decode workers to register"
for i in $(seq 1 120); do
  logs=$(podman logs pd-router-pod-0-pd-router 2>&1)
  if grep -q "registered at 127.0.0.1:18070" <<<"$logs" &&
     grep -q "registered at 127.0.0.1:18072" <<<"$logs"; then break; fi
  [ "$i" -lt 120 ] || { echo "FAIL: the decode workers did not both register"; exit 1; }
  sleep 0.5
done

log "six streams; one decode pod stopped mid-stream"
ready="$work/streams_ready"
timeout 180 "$PDSERVE_PYTHON" "$here/podman_stream_client.py" streams \
  --base_url "$base_url" --n 6 --max_tokens 96 --ready_chunks 4 --ready_file "$ready" \
  >"$work/streams.jsonl" &
client=$!
for i in $(seq 1 300); do [ -f "$ready" ] && break; sleep 0.1; done
[ -f "$ready" ] || { echo "FAIL: the streams did not start"; kill "$client"; exit 1; }
# Stop the decode pod that serves more of the streams (one at least), so the
# check is never vacuous.
running() {
  "$PDSERVE_PYTHON" - "$1" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode()
print(int(sum(float(l.split()[-1]) for l in text.splitlines()
              if l.startswith("pdserve_worker_requests_running"))))
PY
}
on_a=$(running 18071) on_b=$(running 18073)
log "streams running: pd-decode $on_a, pd-decode-b $on_b"
if [ "$on_a" -ge "$on_b" ]; then victim=pd-decode-pod-0; n=$on_a; else victim=pd-decode-b-pod-0; n=$on_b; fi
[ "$n" -ge 1 ] || { echo "FAIL: no decode worker runs a stream"; kill "$client"; exit 1; }
stop_start=$(date +%s.%N)
timeout 60 podman pod stop -t 45 "$victim" >/dev/null
log "$victim stopped in $(awk -v a="$stop_start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s"
streams_rc=0; wait "$client" || streams_rc=$?
cat "$work/streams.jsonl"
victim_log=$(podman logs "$victim-pd-decode-worker" 2>&1 || true)
grep -i "drain\|handing\|stopped" <<<"$victim_log" | tail -5 || true
podman logs pd-router-pod-0-pd-router 2>&1 | grep -i "migrat" | tail -6 || true
grep -q "handing [1-9][0-9]* stream" <<<"$victim_log" ||
  { echo "FAIL: $victim handed no stream back: nothing was migrated"; exit 1; }
[ $streams_rc -eq 0 ] || { echo "FAIL: a stream was dropped or cut short"; exit 1; }
[ "$(grep -c '"ok": true' "$work/streams.jsonl")" -eq 6 ] || { echo "FAIL: not 6 good streams"; exit 1; }

log "stopping every pod gracefully, then podman kube down"
for p in "${pods[@]}"; do  # the stopped one again: a no-op
  timeout 60 podman pod stop -t 45 "$p" >/dev/null
done
bad=0
for p in "${pods[@]}"; do
  for c in $(podman pod inspect "$p" --format '{{range .Containers}}{{.Name}} {{end}}'); do
    code=$(podman inspect "$c" --format '{{.State.ExitCode}}')
    echo "exit code $c: $code"
    [ "$code" = 0 ] || bad=1
  done
done
[ $bad -eq 0 ] || { echo "FAIL: a container did not exit 0"; exit 1; }
timeout 60 podman kube down "$yaml" >/dev/null 2>&1
left=$(podman pod ps --format '{{.Name}}' | grep -c "^pd-" || true)
[ "$left" -eq 0 ] || { echo "FAIL: $left pods left after kube down"; exit 1; }

echo "IMAGE_SIZE_MB=$(( (size + 999999) / 1000000 ))"
echo "KUBE_PLAY_TO_FIRST_ANSWER_S=$("$PDSERVE_PYTHON" -c 'import json,sys; print(json.loads(sys.argv[1])["first_answer_s"])' "$first")"
echo "PASSED"
