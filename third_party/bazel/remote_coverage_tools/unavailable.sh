#!/bin/sh
echo "coverage is not available in pdserve's offline Bazel build" >&2
exit 1
