#!/bin/bash
# The inference servers of one node, where ServerManager(slurm=True) looks for them:
# 8 / INFER_TP servers, server i on port INFER_FIRST_PORT + i with INFER_TP of the node's
# GPUs. INFER_COMMAND runs once per server, in bash, with PORT and CUDA_VISIBLE_DEVICES set.
# Stops every server on SIGTERM (and when one of them exits); logs go to RUN_DIR.
set -euo pipefail
: "${INFER_COMMAND:?}" "${RUN_DIR:?}"
INFER_TP=${INFER_TP:-1}
INFER_FIRST_PORT=${INFER_FIRST_PORT:-9000}
node=${SLURMD_NODENAME:-$(hostname)}
IFS=, read -ra gpus <<< "${CUDA_VISIBLE_DEVICES:-0,1,2,3,4,5,6,7}"
if (( ${#gpus[@]} < 8 )); then
    echo "inference-node.sh: $node has ${#gpus[@]} GPUs for this step (CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES);" \
        "the servers are laid out for 8 (submit with --gpus-per-node=8)" >&2
    exit 2
fi

pids=()
stop() { kill -TERM "${pids[@]}" 2>/dev/null; wait; }
trap 'stop; exit 0' TERM INT
for ((i = 0; i < 8 / INFER_TP; i++)); do
    share=$(IFS=,; echo "${gpus[*]:i * INFER_TP:INFER_TP}")
    PORT=$((INFER_FIRST_PORT + i)) CUDA_VISIBLE_DEVICES=$share bash -c "exec $INFER_COMMAND" \
        > "$RUN_DIR/server-$node-$((INFER_FIRST_PORT + i)).log" 2>&1 &
    pids+=($!)
done
set +e
wait -n
status=$?
echo "inference-node.sh: a server on $node exited with status $status (see $RUN_DIR); stopping the others" >&2
stop
exit "$status"
