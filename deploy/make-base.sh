#!/usr/bin/env bash
# Make the image `opscope-base` from Debian's own packages, for machines that reach a Debian mirror and a
# package index but no image registry (the Containerfile then builds with --build-arg BASE=localhost/opscope-base).
#
#   deploy/make-base.sh                 # -> podman image localhost/opscope-base
#   OPSCOPE_BASE_CACHE=/var/tmp/opscope deploy/make-base.sh    # where the tarball is kept between runs
#
# The tarball is kept (mmdebstrap takes minutes), so a second run only re-imports it. Needs root (or
# `mmdebstrap --mode=unshare` rights), mmdebstrap and podman.
set -euo pipefail
SUITE=${OPSCOPE_BASE_SUITE:-bookworm}
CACHE=${OPSCOPE_BASE_CACHE:-/var/tmp/opscope-base}
NAME=${OPSCOPE_BASE_IMAGE:-opscope-base}
TAR="$CACHE/$SUITE-minbase.tar"

for tool in mmdebstrap podman; do
  command -v "$tool" >/dev/null || { echo "make-base.sh: $tool is not installed: apt-get install podman runc mmdebstrap" >&2; exit 2; }
done
mkdir -p "$CACHE"
if [ ! -s "$TAR" ]; then
  # NOTE: built beside the target and renamed, so a run stopped half-way never leaves a tarball that looks whole.
  # --format=tar: the name ends in .part, which mmdebstrap would otherwise take for a directory.
  rm -rf "$TAR.part"
  mmdebstrap --quiet --format=tar --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    "$SUITE" "$TAR.part"
  mv "$TAR.part" "$TAR"
fi
podman ${OPSCOPE_PODMAN_ARGS:-} import --change 'CMD ["/bin/bash"]' "$TAR" "$NAME" >/dev/null
echo "base image localhost/$NAME from $TAR"
