#!/bin/sh
# Counts the rows of each file of DAMA_ARGS ({"files": ["/data/a.csv", ...]}).
set -eu
total=$(printf '%s' "$DAMA_ARGS" | jq '.files | length')
i=$(printf '%s' "${DAMA_CHECKPOINT:-null}" | jq '.next // 0')  # DAMA_CHECKPOINT is empty on a first attempt
while [ "$i" -lt "$total" ]; do  # from the file after the last one done
  name=$(printf '%s' "$DAMA_ARGS" | jq -r --argjson i "$i" '.files[$i]')
  if [ ! -e "$name" ]; then  # no retry can help: fail for good, saying why
    jq -nc --arg e "$name is missing" '{type: "failure", payload: {error: $e, retry: false}}' >&3
    exit 1
  fi
  rows=$(wc -l < "$name")  # anything that fails fails the attempt: it is retried
  i=$((i + 1))
  jq -nc --arg f "$name" --argjson r "$rows" '{type: "rows_loaded", payload: {file: $f, rows: $r}}' >&3
  echo "{\"type\": \"checkpoint\", \"payload\": {\"next\": $i}}" >&3  # a retry starts from here
  echo "{\"type\": \"progress\", \"payload\": {\"step\": $i, \"of\": $total}}" >&3
done
