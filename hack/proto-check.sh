#!/usr/bin/env bash
# Regenerates the gRPC stubs into a scratch directory and fails when they differ
# from the committed ones, so nobody edits generated code or forgets `make proto`.
set -euo pipefail
PY=$1; shift
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$PY" -m grpc_tools.protoc -I . --python_out="$tmp" --pyi_out="$tmp" --grpc_python_out="$tmp" "$@"
status=0
for proto in "$@"; do
  base=${proto%.proto}
  for f in "${base}_pb2.py" "${base}_pb2.pyi" "${base}_pb2_grpc.py"; do
    if ! cmp -s "$tmp/$f" "$f"; then
      echo "proto drift: $f differs from what 'make proto' generates; run 'make proto' and commit" >&2
      status=1
    fi
  done
done
[ $status = 0 ] && echo "proto stubs up to date"
exit $status
