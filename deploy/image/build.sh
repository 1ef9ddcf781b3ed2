#!/usr/bin/env bash
# Builds pdserve's container image offline and loads it into podman:
#
#   deploy/image/build.sh [--tag localhost/pdserve:dev] [--model_image]
#                         [--model FILE] [--model_tag localhost/pdserve-model:dev]
#                         [--no_build] [--budget_mb 250] [--bin FILE ...]
#
#   1. bazel build -c opt of the serving binaries (pd-router,
#      pd-prefill-worker, pd-decode-worker, pd-planner, pdctl, pd-generate).
#      Not --config=opt: that adds -march=native, and the image must run on
#      any x86-64. The kernels pick AVX2 / AVX-512 at run time by CPUID
#      (kernels/matmul.cc), so a portable build loses nothing on a fast CPU;
#   2. a root filesystem holding the stripped binaries (/opt/pdserve/bin),
#      exactly the shared libraries they load (ldd, plus UCX's transport
#      modules, which UCX dlopens from <libdir>/ucx), the dynamic loader,
#      /etc/passwd and /etc/group with the user pdserve (uid/gid 10001), and
#      an empty /tmp: no shell, no package manager, no compilers or headers;
#   3. `podman import` of that tree as a one-layer OCI image, user 10001,
#      loaded into podman's local store as --tag;
#   4. prints the image size and fails when it exceeds --budget_mb (250 MB,
#      the model not included).
# --bin FILE (repeatable) takes those binaries instead of building: the
# podman test packs the binaries Bazel built for it, as they are.
#
# The image never holds the model. --model_image also builds a model image:
# only the GGUF (default: the model scripts/setup.sh fetches) at
# /models/model.gguf, no binaries, for a Kubernetes image volume (see
# deploy/k8s/base/model-volume.yaml); or mount the GGUF from a volume or a
# host path at /models and point --model at it (the ConfigMap's flags do).
#
# The root filesystem is read-only-safe: the processes write nothing outside
# /tmp (mount an emptyDir or a tmpfs there). Try it:
#   CONTAINERS_CONF=deploy/image/containers.conf podman run --rm --read-only \
#     -v "$PDSERVE_DEFAULT_MODEL:/models/model.gguf:ro" localhost/pdserve:dev \
#     pd-generate --model /models/model.gguf --prompt "The capital of France is"
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$(repo_root)"

tag=localhost/pdserve:dev
model_tag=localhost/pdserve-model:dev
model_file="$PDSERVE_DEFAULT_MODEL"
model_image=0
build=1
budget_mb=250
explicit_bins=()
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag=$2; shift 2 ;;
    --model_image) model_image=1; shift ;;
    --model) model_file=$2; model_image=1; shift 2 ;;
    --model_tag) model_tag=$2; shift 2 ;;
    --no_build) build=0; shift ;;
    --budget_mb) budget_mb=$2; shift 2 ;;
    --bin) explicit_bins+=("$(readlink -f "$2")"); build=0; shift 2 ;;
    *) die "unknown argument $1 (see the comment at the top of $0)" ;;
  esac
done

# podman on these machines needs this configuration (see the file).
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/deploy/image/containers.conf}"
command -v podman >/dev/null || die "podman is missing (scripts/setup.sh installs it)"

TARGETS=(
  //router:pd-router
  //prefill_worker:pd-prefill-worker
  //decode_worker:pd-decode-worker
  //autoscaler:pd-planner
  //cli:pdctl
  //engine:pd-generate
)
if [ $build -eq 1 ]; then
  step "bazel build -c opt (portable x86-64: kernels choose AVX at run time)"
  bazel build -c opt "${TARGETS[@]}"
fi
sources=()
if [ ${#explicit_bins[@]} -gt 0 ]; then
  sources=("${explicit_bins[@]}")
else
  bin_dir="$(bazel info -c opt bazel-bin 2>/dev/null)"
  for t in "${TARGETS[@]}"; do
    path="$bin_dir/${t#//}"
    sources+=("${path/://}")
  done
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
mkdir -p "$root/opt/pdserve/bin" "$root/etc" "$root/tmp" "$root/models" \
  "$root/etc/pdserve" "$root/var/run/secrets/pdserve"
chmod 1777 "$root/tmp"

step "Root filesystem"
binaries=()
for path in "${sources[@]}"; do
  [ -x "$path" ] || die "$path missing: build it first (bazel build -c opt //...)"
  install -m 0755 "$path" "$root/opt/pdserve/bin/"
  strip --strip-unneeded "$root/opt/pdserve/bin/$(basename "$path")"
  binaries+=("$root/opt/pdserve/bin/$(basename "$path")")
done

# UCX opens its transport modules from <libdir>/ucx at run time, which ldd
# cannot see. Shared memory (cma) is always wanted; the InfiniBand and
# RDMA-CM modules only when their own libraries are installed here.
ucx_modules=()
for m in /usr/lib/x86_64-linux-gnu/ucx/libuct_*.so.0; do
  [ -e "$m" ] || continue
  if ldd "$m" | grep -q "not found"; then
    info "leaving out $(basename "$m") (its libraries are not installed)"
    continue
  fi
  ucx_modules+=("$m")
done

# Every library any binary or module loads, with the paths the loader finds
# them at; copied with their symlink names resolved to files.
libs=$(for f in "${binaries[@]}" "${ucx_modules[@]}"; do
  ldd "$f" | awk '/=> \// {print $3} /^\t\/[^ ]*ld-linux/ {print $1}'
done | sort -u)
if for f in "${binaries[@]}"; do ldd "$f"; done | grep "not found"; then
  die "a binary needs a library this machine lacks"
fi
for lib in $libs "${ucx_modules[@]}"; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
# The loader is looked up at /lib64/ld-linux-x86-64.so.2; Debian's usrmerge
# makes /lib a link to /usr/lib, which the copied paths above may mix.
if [ -d "$root/lib" ] && [ -d "$root/usr/lib" ]; then
  cp -a "$root/lib/." "$root/usr/lib/" && rm -rf "$root/lib"
fi
[ -d "$root/lib" ] || ln -s usr/lib "$root/lib"
if [ -d "$root/lib64" ] && [ ! -L "$root/lib64" ]; then
  mkdir -p "$root/usr/lib64"
  cp -a "$root/lib64/." "$root/usr/lib64/" && rm -rf "$root/lib64"
fi
[ -e "$root/lib64" ] || ln -s usr/lib64 "$root/lib64"
info "${#binaries[@]} binaries, $(echo "$libs" | wc -l) libraries, ${#ucx_modules[@]} UCX modules"

# A non-root user; no shell exists in the image, hence /nonexistent paths.
cat >"$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/usr/sbin/nologin
pdserve:x:10001:10001:pdserve:/tmp:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
PASSWD
cat >"$root/etc/group" <<'GROUP'
root:x:0:
pdserve:x:10001:
nogroup:x:65534:
GROUP
# getaddrinfo reads these (the headless Service's DNS name, localhost).
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$root/etc/hosts"

tar -C "$root" --owner=0 --group=0 --numeric-owner -cf "$work/rootfs.tar" .

step "podman import -> $tag"
podman rmi -f "$tag" >/dev/null 2>&1 || true
podman import \
  --change "USER=10001:10001" \
  --change "WORKDIR=/tmp" \
  --change "ENV=PATH=/opt/pdserve/bin" \
  --change "ENV=TMPDIR=/tmp" \
  --change "LABEL=org.opencontainers.image.title=pdserve" \
  --change "LABEL=org.opencontainers.image.revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  "$work/rootfs.tar" "$tag" >/dev/null
size=$(podman image inspect --format '{{.Size}}' "$tag")
size_mb=$(( (size + 999999) / 1000000 ))
info "image $tag: $size bytes (${size_mb} MB, budget ${budget_mb} MB, model not included)"
echo "IMAGE_SIZE_BYTES=$size"
[ "$size_mb" -le "$budget_mb" ] || die "image $tag is ${size_mb} MB, over the ${budget_mb} MB budget"

if [ $model_image -eq 1 ]; then
  step "model image $model_tag ($model_file)"
  [ -f "$model_file" ] || die "$model_file missing (scripts/setup.sh fetches the default model)"
  mroot="$work/model"
  mkdir -p "$mroot/models"
  cp "$model_file" "$mroot/models/model.gguf"
  chmod 0444 "$mroot/models/model.gguf"
  tar -C "$mroot" --owner=0 --group=0 --numeric-owner -cf "$work/model.tar" .
  podman rmi -f "$model_tag" >/dev/null 2>&1 || true
  podman import --change "LABEL=org.opencontainers.image.title=pdserve-model" \
    "$work/model.tar" "$model_tag" >/dev/null
  info "model image $model_tag: $(podman image inspect --format '{{.Size}}' "$model_tag") bytes"
fi
