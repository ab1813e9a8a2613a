#!/usr/bin/env bash
# `make demo`: the bot end to end on this machine.
#  1. selftest with no configuration at all (what a fresh install checks first);
#  2. the lab (real Slurm, MariaDB, slurmdbd, etcd, Prometheus, Alertmanager and the
#     Kubernetes API fake): a drain approved by a second person, the node returned to
#     service after its health check, a maintenance reservation opened and closed, a
#     maintenance window (reservation, cordon, silence, a runbook inside) opened and
#     closed, the node view, an XID alert becoming a swap-gpu proposal, and a drain asked
#     with /runbook and approved with the button in Slack (the lab's fake of Slack's Web API,
#     signed requests to runbook serve), the audit log streamed by serve to the lab's rsyslogd
#     and OTLP receiver, the console at /ui (HTTP basic, a lab-only password). Identities
#     are the lab's users (--as, Slack IDs);
#  3. it ends in `runbook chat` (interactive at a terminal, a short script otherwise).
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
  "$runbook" db init   # the one command that creates the database
  "$runbook" run selftest message="hello from make demo" --wait
  "$runbook" audit verify
)

step "2. the lab: deploy/lab/lab up (real Slurm, MariaDB, slurmdbd, slurmrestd)"
deploy/lab/lab up
eval "$(deploy/lab/lab env)"
# the bot's lab database and its audit checkpoints start afresh together: a checkpoint left by
# an earlier run (make test uses this lab too) describes another log, and verify would say so
rm -f "$RUNBOOK_LAB_DIR/bot.db" "$RUNBOOK_LAB_DIR/audit.checkpoints"
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

step "a maintenance window on gpu[04-05]: created, approved ahead by carol, opened, closed"
echo "A window opens at its start (the scheduler of 'runbook serve' fires it) and closes at its"
echo "end. Rather than wait real minutes, this demo opens it now ('window open --wait') and"
echo "closes it early ('window cancel --wait'): the same executions the scheduler would request."
"$runbook" window create "gpu[04-05]" start=now duration=30m reason="demo window" \
  runbooks="selftest message=inside-the-window" --as alice | tee "$demo_dir/window.log"
wid=$(awk '/^window [0-9]+:/{sub(":", "", $2); print $2; exit}' "$demo_dir/window.log")
"$runbook" window approve "$wid" --as carol
"$runbook" window open "$wid" --wait --as alice
echo "--- while it is open:"
scontrol show reservation "window-$wid"
"$runbook" node gpu05 | sed -n '1,3p'
amtool --alertmanager.url="$ALERTMANAGER_URL" silence query
"$runbook" window cancel "$wid" --wait --as alice
echo "--- after it closed:"
scontrol show reservation "window-$wid" 2>&1 || true
"$runbook" node gpu05 | sed -n '1,3p'
amtool --alertmanager.url="$ALERTMANAGER_URL" silence query
"$runbook" schedule list    # the lab configuration schedules gpu-usage-report weekly

step "runbook node gpu05: Slurm, Kubernetes and its GPUs (gpu05 is in both pools)"
"$runbook" node gpu05

step "an XID 79 on gpu03 travels Prometheus -> Alertmanager -> runbook serve: gpu03 is quarantined at once, its swap-gpu waits for a person"
echo "(Alertmanager sends the lab's bearer token, RUNBOOK_ALERTS_TOKEN: /alerts refuses a POST"
echo " without it with 401)"
deploy/lab/lab slack reset  # the lab's fake Slack starts with an empty channel
"$runbook" serve >"$demo_dir/serve.log" 2>&1 &
serve_pid=$!
trap 'kill $serve_pid 2>/dev/null || true' EXIT
deploy/lab/lab fault gpu03 xid=79 xid_gpu=5
for _ in $(seq 1 60); do
  "$runbook" proposals | grep -q swap-gpu && break
  sleep 1
done
"$runbook" proposals   # GpuXid through the XID table (remediation.xid): 79 is swap
for _ in $(seq 1 30); do   # 79 is in remediation.quarantine: quarantine-node ran by itself
  sinfo -h -n gpu03 -o %T | grep -q drain && break
  sleep 1
done
sinfo -h -n gpu03 -o "%N %T %E"   # drained (its jobs left to finish), the alert in the reason
deploy/lab/lab fault gpu03 clear
scontrol update NodeName=gpu03 State=RESUME   # the demo puts it back by hand
"$runbook" breaker status   # automation stops when the bot holds too much of a pool out

step "Slack: alice types /runbook run drain-node; bob's Approve is refused; carol's runs it"
echo "(signed requests to runbook serve's /slack/events; the lab's fake of Slack's Web API"
echo " records every call the bot makes: deploy/lab/lab slack calls)"
newest_drain() { "$runbook" history --runbook drain-node --json |
  python3 -c 'import json,sys; print(max([e["id"] for e in json.load(sys.stdin)] or [0]))'; }
before=$(newest_drain)
deploy/lab/lab slack command --user U0ALICE 'run drain-node node=gpu04 reason="fan failure"'
for _ in $(seq 1 100); do [ "$(newest_drain)" != "$before" ] && break; sleep 0.1; done
sid=$(newest_drain)
hash=$("$runbook" status "$sid" | sed -n 's/.*plan hash //p')
sleep 1  # the plan reaches the channel within the poster's interval
deploy/lab/lab slack click --user U0BOB approve "$sid:$hash"
deploy/lab/lab slack click --user U0CAROL approve "$sid:$hash"
for _ in $(seq 1 120); do
  "$runbook" status "$sid" | grep -q -- "— SUCCEEDED\|— FAILED" && break
  sleep 0.5
done
sleep 1.5  # the final summary reaches the thread
deploy/lab/lab slack messages

step "the audit log, streamed by serve's leader to the lab's rsyslogd and OTLP receiver"
last=$("$runbook" audit export | tail -n 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["seq"])')
for _ in $(seq 1 50); do  # shipped within a second or so of being written
  grep -q "seq=\"$last\"" "$LAB_SYSLOG_RECEIVED" 2>/dev/null &&
    grep -q "\"audit.seq\": $last}" "$LAB_OTLP_RECEIVED" 2>/dev/null && break
  sleep 0.2
done
echo "syslog (RFC 5424 over TCP): $(grep -c . "$LAB_SYSLOG_RECEIVED" || true) messages in $LAB_SYSLOG_RECEIVED, the last:"
tail -n 1 "$LAB_SYSLOG_RECEIVED" 2>/dev/null | cut -c1-300 || true
echo "OTLP/HTTP: $(grep -c . "$LAB_OTLP_RECEIVED" || true) log records in $LAB_OTLP_RECEIVED (last event: $last)"

step "the console: runbook serve's read-only web pages at /ui"
console_url=$(.venv/bin/python -c 'import os, yaml
server = yaml.safe_load(open(os.environ["RUNBOOK_CONFIG"]))["server"]
print("http://%s:%s/ui/" % (server["host"], server["port"]))')
echo "open $console_url while serve runs; the lab's sign-in (lab-only password):"
echo "  carol / lab-console-password (auditor: everything), alice / lab-console-password"
.venv/bin/python - "$console_url" <<'PY'
import base64, sys, urllib.error, urllib.request
url = sys.argv[1]
def get(path, user=None):
    request = urllib.request.Request(url + path)
    if user:
        token = base64.b64encode(f"{user}:lab-console-password".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, ""
print(f"GET {url}executions without signing in: {get('executions')[0]}")
status, page = get("executions", "carol")
print(f"GET {url}executions as carol: {status}, {len(page)} bytes of HTML")
status, table = get("executions.csv?runbook=drain-node", "carol")
print(f"GET {url}executions.csv?runbook=drain-node as carol: {status}")
for line in table.splitlines()[:4]:
    print("  " + ",".join(line.split(",")[:7]))
PY
kill $serve_pid 2>/dev/null || true
run_approved alice carol resume-node node=gpu04 >/dev/null

step "runbook history, one timeline, and the audit chain (with the checkpoints serve kept)"
"$runbook" history
"$runbook" show "$id"
"$runbook" audit verify --checkpoints

step "the terminal chat: the grammar and answers of Slack's /runbook, at a prompt"
if [ -t 0 ]; then
  echo "Try: help | list | plan drain-node node=gpu03 reason=test | run ... | /as carol |"
  echo "     approve ID | history | node gpu05 | /quit"
  "$runbook" chat --as alice
else
  printf '%s\n' 'list' 'describe resume-node' 'history' 'node gpu04' |
    "$runbook" chat --as alice
fi

echo
echo "The lab keeps running for you to explore:  eval \"\$(deploy/lab/lab env)\""
echo "Stop it with: make lab-down        (demo files: $demo_dir)"
