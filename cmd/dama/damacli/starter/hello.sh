#!/bin/sh
# The example task of dama.yaml's kind hello: STEPS steps of a second each
# (DAMA_ARGS {"steps": N}, default 10), reporting its progress and a
# checkpoint after each, one JSON line each on the events pipe. A retry
# resumes after the last checkpoint: try `dama cancel`, then `dama retry`.
#   dama submit hello --args '{"steps": 5}' --wait
set -eu
number() { # the number after "$1": in the JSON of $2, or nothing
	printf '%s' "$2" | sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p"
}
steps=$(number steps "${DAMA_ARGS:-}")
steps=${steps:-10}
step=$(number next_step "${DAMA_CHECKPOINT:-}")
step=${step:-1}
while [ "$step" -le "$steps" ]; do
	echo "step $step of $steps"
	sleep 1
	echo "{\"type\": \"progress\", \"payload\": {\"step\": $step, \"of\": $steps}}" >&"$DAMA_EVENTS_FD"
	step=$((step + 1))
	echo "{\"type\": \"checkpoint\", \"payload\": {\"next_step\": $step}}" >&"$DAMA_EVENTS_FD"
done
echo "hello: $steps steps done"
