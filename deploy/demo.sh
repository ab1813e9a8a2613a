#!/usr/bin/env bash
# `make demo`: the bot end to end on this machine.
#  1. selftest with no configuration at all (what a fresh install checks first);
#  2. the lab (real Slurm, MariaDB, slurmdbd, etcd, Prometheus, Alertmanager and the
#     Kubernetes API fake): a drain approved by a second person, the node returned to
#     service after its health check, a maintenance reservation opened and closed, the
#     node view, and an XID alert becoming a swap-gpu proposal. Identities are the
#     lab's users (--as).
set -euo pipefail
cd "$(dirname "$0")/.."
runbook=$PWD/.venv/bin/runbook
demo_dir=$(mktemp -d -t grb-demo-XXXXXX)

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# Run a runbook as one user and approve it as others, the way two terminals would.
run_approved() {
  local as=$1; shift
  local approvers=$1; shift
  local log="$demo_dir/run-$RANDOM.log"
  "$runbook" run "$@" --wait --as "$as" >"$log" 2>&1 &
  local pid=$!
  until grep -q '^execution ' "$log" 2>/dev/null || ! kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  local id
  id=$(awk '/^execution /{print $2; exit}' "$log")
  for approver in $approvers; do
    [ -n "$id" ] && "$runbook" approve "$id" --as "$approver"
  done
  local rc=0
  wait "$pid" || rc=$?
  cat "$log"
  return $rc
}

step "1. selftest with no configuration file (state in a temporary folder)"
(
  export XDG_STATE_HOME="$demo_dir/state"
  unset RUNBOOK_CONFIG RUNBOOK_DB_URL
  "$runbook" run selftest message="hello from make demo" --wait
  "$runbook" audit verify
)

step "2. the lab: deploy/lab/lab up (real Slurm, MariaDB, slurmdbd, slurmrestd)"
deploy/lab/lab up
eval "$(deploy/lab/lab env)"
sinfo

step "runbook plan drain-node node=gpu02 reason=\"XID 79 on GPU 3\""
"$runbook" plan drain-node node=gpu02 reason="XID 79 on GPU 3"

step "alice runs drain-node; bob may not approve it; carol does"
"$runbook" run drain-node node=gpu02 reason="XID 79 on GPU 3" --as alice >"$demo_dir/req.log"
id=$(awk '/^execution /{print $2; exit}' "$demo_dir/req.log")
cat "$demo_dir/req.log"
"$runbook" approve "$id" --as bob || true
"$runbook" approve "$id" --as carol
"$runbook" engine --once
sinfo -N -o "%N %T %E"

step "resume-node: health check inside a maintenance reservation, then back to service"
run_approved alice carol resume-node node=gpu02
sinfo -N -o "%N %T %E"

step "open-maintenance on gpu[03-04] for 2 hours, then close-maintenance"
run_approved alice dave open-maintenance name=demo-window nodes="gpu[03-04]" duration=2h
scontrol show reservation demo-window
run_approved alice "" close-maintenance name=demo-window

step "runbook node gpu05: Slurm, Kubernetes and its GPUs (gpu05 is in both pools)"
"$runbook" node gpu05

step "an XID 79 on gpu03 travels Prometheus -> Alertmanager -> runbook serve -> a proposal"
"$runbook" serve >"$demo_dir/serve.log" 2>&1 &
serve_pid=$!
trap 'kill $serve_pid 2>/dev/null || true' EXIT
deploy/lab/lab fault gpu03 xid=79 xid_gpu=5
for _ in $(seq 1 60); do
  "$runbook" proposals | grep -q swap-gpu && break
  sleep 1
done
"$runbook" proposals
deploy/lab/lab fault gpu03 clear
kill $serve_pid 2>/dev/null || true

step "runbook history, one timeline, and the audit chain"
"$runbook" history
"$runbook" show "$id"
"$runbook" audit verify

echo
echo "The lab keeps running for you to explore:  eval \"\$(deploy/lab/lab env)\""
echo "Stop it with: make lab-down        (demo files: $demo_dir)"
