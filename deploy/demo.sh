#!/usr/bin/env bash
# `make demo`: the bot end to end on this machine.
#  1. selftest with no configuration at all (a fresh install's check);
#  2. a two-person flow in the lab configuration: alice asks, bob may not approve, carol does.
set -euo pipefail
cd "$(dirname "$0")/.."
runbook=.venv/bin/runbook
demo_dir=$(mktemp -d -t grb-demo-XXXXXX)
export XDG_STATE_HOME="$demo_dir/state"
unset RUNBOOK_CONFIG RUNBOOK_DB_URL

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "runbook list (built-in defaults, no configuration file)"
$runbook list
step "runbook plan selftest"
$runbook plan selftest message="hello from make demo"
step "runbook run selftest --wait"
$runbook run selftest message="hello from make demo" --wait
step "runbook history"
$runbook history
step "runbook audit verify"
$runbook audit verify
echo
echo "demo state is in $demo_dir (delete it when done)"
